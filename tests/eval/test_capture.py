"""Capture mechanics on a tiny randomly initialised Llama (2 layers, GQA 6:2 heads)."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from lynx_npu.eval.capture import capture_qkv  # noqa: E402
from lynx_npu.eval.metrics import causal_attention  # noqa: E402

T = 40


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=97, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, head_dim=8, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (T,), generator=torch.Generator().manual_seed(1))
    return model, ids


def _attn_outputs_of_a_plain_run(model, ids):
    """Each layer's self-attention output (after o_proj) in an ordinary forward pass."""
    outs, hooks = {}, []
    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.self_attn.register_forward_hook(
            lambda mod, args, out, i=i: outs.__setitem__(i, out[0][0].detach().clone())))
    try:
        with torch.no_grad():
            logits = model(ids[None]).logits
    finally:
        for h in hooks:
            h.remove()
    return outs, logits


def test_captured_qkv_reproduce_the_models_attention_output(tiny):
    model, ids = tiny
    expected, _ = _attn_outputs_of_a_plain_run(model, ids)
    layers = capture_qkv(model, ids, keep_output=True)
    assert len(layers) == 2
    for i, layer in enumerate(layers):
        assert layer.q.shape == (6, T, 8) and layer.k.shape == (2, T, 8) == layer.v.shape
        assert layer.q.dtype == torch.float32
        # Our GQA-aware causal attention of the captured tensors, through the layer's o_proj,
        # must give what the unmodified model computed.
        o = causal_attention(layer.q, layer.k, layer.v)                 # [H, T, D]
        torch.testing.assert_close(o, layer.out, rtol=1e-5, atol=1e-6)
        o_proj = model.model.layers[i].self_attn.o_proj
        with torch.no_grad():
            got = o_proj(o.transpose(0, 1).reshape(T, -1))
        torch.testing.assert_close(got, expected[i], rtol=1e-5, atol=1e-6)


def test_capture_leaves_the_model_unchanged(tiny):
    model, ids = tiny
    impl = model.config._attn_implementation
    _, before = _attn_outputs_of_a_plain_run(model, ids)
    capture_qkv(model, ids)
    assert model.config._attn_implementation == impl
    _, after = _attn_outputs_of_a_plain_run(model, ids)
    torch.testing.assert_close(before, after, rtol=0, atol=0)


def test_keys_differ_from_pre_rope_projection(tiny):
    # Post-RoPE: position 0 is unrotated, later positions are rotated.
    model, ids = tiny
    layer0 = capture_qkv(model, ids)[0]
    attn = model.model.layers[0].self_attn
    with torch.no_grad():
        h = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids[None]))
        k_pre = attn.k_proj(h)[0].view(T, 2, 8).transpose(0, 1)
        v_pre = attn.v_proj(h)[0].view(T, 2, 8).transpose(0, 1)
    torch.testing.assert_close(layer0.k[:, 0], k_pre[:, 0], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(layer0.k[:, 1:], k_pre[:, 1:], atol=1e-3)
    torch.testing.assert_close(layer0.v, v_pre, rtol=1e-5, atol=1e-6)


def test_keep_last_queries_and_progress_callback(tiny):
    model, ids = tiny
    seen = []
    full = capture_qkv(model, ids)
    last = capture_qkv(model, ids, keep_last_queries=5, on_layer=seen.append)
    assert seen == [0, 1]
    assert last[1].q.shape == (6, 5, 8) and last[1].k.shape == (2, T, 8)
    torch.testing.assert_close(last[1].q, full[1].q[:, -5:], rtol=0, atol=0)


def test_bad_input_ids(tiny):
    model, ids = tiny
    with pytest.raises(ValueError, match="1-D"):
        capture_qkv(model, ids[None])
    with pytest.raises(ValueError, match="keep_last_queries"):
        capture_qkv(model, ids, keep_last_queries=0)
