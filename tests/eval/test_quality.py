"""The quality measure on a tiny random Llama: scoring over a replaced prompt cache equals a plain
forward when the cache is exact; CacheGen's shortcut is its codec's round trip."""
import pytest
import torch

import lynx_npu
from lynx_npu.eval import accept, quality

from .quality_fixtures import tiny_llama

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(96, 256)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 96, (48,), generator=torch.Generator().manual_seed(1)).tolist()


def test_cachegen_shortcut_is_decode_of_encode():
    codec = lynx_npu.get_codec("cachegen")
    g = torch.Generator().manual_seed(0)
    layers = [(torch.randn(2, 300, 16, generator=g).bfloat16(),
               torch.randn(2, 300, 16, generator=g).bfloat16()) for _ in range(12)]
    want = accept.reconstruct(codec, layers, ("full",)).stages["full"]
    got = quality.reconstruct_last_stage(codec, layers)
    for (k, v), (k_hat, v_hat) in zip(want, got):
        assert torch.equal(k, k_hat) and torch.equal(v, v_hat)
    assert not torch.equal(got[0][0], layers[0][0])  # it is lossy


def test_last_stage_is_lynx_full_and_lynx_int4_anchor():
    g = torch.Generator().manual_seed(0)
    layers = [(torch.randn(2, 64, 16, generator=g).bfloat16(),
               torch.randn(2, 64, 16, generator=g).bfloat16())]
    full = quality.reconstruct_last_stage(lynx_npu.get_codec("lynx"), layers)
    want = accept.reconstruct(lynx_npu.get_codec("lynx"), layers, ("full",)).stages["full"]
    assert torch.equal(full[0][0], want[0][0]) and torch.equal(full[0][1], want[0][1])
    # lynx-int4 sends lynx's anchor with exact scalars and no window (lynx's own anchor has
    # 1-byte previews and the recent tokens at full precision)
    anchor = quality.reconstruct_last_stage(lynx_npu.get_codec("lynx-int4"), layers)
    exact_scalars = lynx_npu.get_codec("lynx", scalar_preview=False, recent_tokens=0)
    want = accept.reconstruct(exact_scalars, layers, ("anchor",)).stages["anchor"]
    assert torch.equal(anchor[0][0], want[0][0]) and torch.equal(anchor[0][1], want[0][1])


def test_teacher_forced_nll_over_the_exact_cache_is_a_plain_forward(tiny, ids):
    context, continuation = ids[:32], ids[32:]
    kv = accept.prefill(tiny, torch.tensor(context[:-1]))
    nll = quality.continuation_nll(tiny, kv.layers, context[-1], continuation)
    with torch.inference_mode():
        logits = tiny(input_ids=torch.tensor([ids])).logits[0]
    want = torch.nn.functional.cross_entropy(logits[31:-1], torch.tensor(continuation))
    assert nll == pytest.approx(float(want), rel=1e-4)
    noisy = [(k + 0.5 * torch.randn_like(k), v) for k, v in kv.layers]
    assert quality.continuation_nll(tiny, noisy, context[-1], continuation) != pytest.approx(nll)
    with pytest.raises(ValueError, match="empty"):
        quality.continuation_nll(tiny, kv.layers, context[-1], [])


def test_choose_over_the_exact_cache_is_the_argmax_of_a_plain_forward(tiny, ids):
    kv = accept.prefill(tiny, torch.tensor(ids[:-1]))
    options = [3, 17, 40, 41, 90]
    with torch.inference_mode():
        logits = tiny(input_ids=torch.tensor([ids])).logits[0, -1]
    want = int(logits[options].argmax())
    assert quality.choose(tiny, [kv.layers, kv.layers], ids[-1], options) == [want, want]


def test_generate_starts_with_the_prefills_token_then_decodes(tiny, ids):
    codecs = [(name, lynx_npu.get_codec(name)) for name in ("bf16", "int4")]
    first, caches = quality.codec_caches(tiny, torch.tensor(ids), codecs, torch.float32)
    out = quality.generate(tiny, caches, first, 6)
    with torch.inference_mode():
        ref = tiny.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)).long(),
                            max_new_tokens=6, do_sample=False, pad_token_id=0)
    ref = ref[0, len(ids):].tolist()
    assert out["bf16"] == ref and out["int4"][0] == ref[0] and len(out["int4"]) == 6
    assert quality.generate(tiny, caches, first, 1) == {"bf16": [first], "int4": [first]}


def test_teacher_forcing_keeps_gemmas_sliding_window():
    """A Gemma 3 layout (two 16-token sliding-window layers, one global): the teacher-forced
    continuation over the refilled decode cache scores as a plain forward does."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=96, hidden_size=64, intermediate_size=128,
                              num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
                              head_dim=32, max_position_embeddings=512, sliding_window=16,
                              layer_types=["sliding_attention", "sliding_attention",
                                           "full_attention"], initializer_range=0.2)
    model = Gemma3ForCausalLM(config).eval()
    ids = torch.randint(0, 96, (80,), generator=torch.Generator().manual_seed(1)).tolist()
    kv = accept.prefill(model, torch.tensor(ids[:47]))
    nll = quality.continuation_nll(model, kv.layers, ids[47], ids[48:])
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    assert nll == pytest.approx(float(torch.nn.functional.cross_entropy(
        logits[47:-1], torch.tensor(ids[48:]))), rel=1e-5)
