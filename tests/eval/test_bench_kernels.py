"""``lynx bench kernels`` on the CPU, tiny: the JSON the issue specifies and the paged options."""
import argparse
import json

import pytest

from lynx_npu.eval import bench_kernels


def _run(tmp_path, *argv):
    p = argparse.ArgumentParser()
    bench_kernels.add_arguments(p)
    out = tmp_path / "bench.json"
    args = p.parse_args(["--device", "cpu", "--layers", "1", "--kv-heads", "2", "--tokens", "300",
                         "--head-dim", "64", "--repeats", "1", "--json", str(out), *argv])
    assert bench_kernels.run(args) == 0
    return json.loads(out.read_text())


def test_json_schema_and_paged_options(tmp_path):
    got = _run(tmp_path, "--paged-layout", "vllm_ascend", "--block-order", "sequential")
    assert got["device"].startswith("cpu") and got["copy_gbps"] > 0
    assert [r["op"] for r in got["results"]] == list(bench_kernels.OPS)
    for r in got["results"]:
        assert r["backend"] and r["shape"] == [1, 2, 300, 64] and r["gbps"] > 0
    assert got["paged"] == {"layout": "vllm_ascend", "block_order": "sequential"}


def test_unknown_paged_layout_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):  # refused by argparse, before the benchmark starts
        _run(tmp_path, "--ops", "decompress_paged", "--paged-layout", "no_such_layout")
    assert "--paged-layout: invalid choice: 'no_such_layout'" in capsys.readouterr().err


def test_set_and_plan_reach_each_layers_config(tmp_path):
    got = _run(tmp_path, "--layers", "2", "--ops", "compress,decompress_full",
               "--set", "anchor_bits=5", "--set", "layer_v_chunk_size=[[1, 64]]")
    assert got["config"]["anchor_bits"] == 5 and got["config"]["layer_v_chunk_size"] == [[1, 64]]
    assert [r["op"] for r in got["results"]] == ["compress", "decompress_full"]
    smollm2 = _run(tmp_path, "--layers", "30", "--tokens", "64", "--ops", "compress",
                   "--plan", "smollm2")["config"]
    assert smollm2["layer_anchor_bits"] == [[18, 5, 4], [23, 5, 4]]
    assert smollm2["v_chunk_size"] == 64


def test_set_refuses_unknown_parameters_and_foreign_plans(tmp_path):
    with pytest.raises(ValueError, match=r"unknown lynx parameter\(s\) \['no_such'\]"):
        _run(tmp_path, "--set", "no_such=1")
    with pytest.raises(ValueError, match="must look like key=value"):
        _run(tmp_path, "--set", "anchor_bits")
    with pytest.raises(ValueError, match="names layer 23, but the model has 1 layers"):
        _run(tmp_path, "--plan", "smollm2")
