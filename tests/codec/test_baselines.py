import pytest
import torch
from hypothesis import given, settings, strategies as st

import lynx_npu
from lynx_npu.codec import affine

RAGGED = [1, 31, 33, 255, 257, 1000]
BASELINES = ["bf16", "int8", "int4", "kivi4", "quantspec"]


def kv(t, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = (torch.randn(3, t, 64, generator=g) * torch.linspace(0.1, 8, 64)).to(dtype)
    v = torch.randn(3, t, 64, generator=g).to(dtype)
    return k, v


@pytest.mark.parametrize("name", BASELINES)
@pytest.mark.parametrize("tokens", RAGGED)
def test_ragged_roundtrip_shapes_and_pages(name, tokens):
    codec = lynx_npu.get_codec(name)
    k, v = kv(tokens, seed=tokens)
    enc = codec.encode(k, v)
    last = codec.decode(enc, codec.stages[-1])
    assert all(x.shape == k.shape and x.dtype == k.dtype for x in last)
    pages = codec.encode_pages(k, v)
    wire = sum(p.anchor.numel() + (0 if p.residual is None else p.residual.numel()) for p in pages)
    if tokens <= codec.page_size:
        assert wire == enc.nbytes(codec.stages[-1])
    parts = [codec.decode_page(p.anchor, p.residual, p.token_start, p.token_end,
                               num_kv_heads=3, head_dim=64, dtype=k.dtype) for p in pages]
    k2 = torch.cat([p[0] for p in parts], dim=1)
    assert k2.shape == k.shape


@pytest.mark.parametrize("name,bits", [("int8", 8), ("int4", 4)])
def test_per_token_error_within_half_a_step(name, bits):
    k, v = kv(300, dtype=torch.float32)
    codec = lynx_npu.get_codec(name)
    k2, v2 = codec.decode(codec.encode(k, v))
    for x, x2 in ((k, k2), (v, v2)):
        step = (x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)) / ((1 << bits) - 1)
        assert bool(((x2 - x).abs() <= step * 0.5 * 1.01 + 1e-3 * x.abs().amax()).all())


def test_wire_sizes_count_every_scalar():
    k, v = kv(256)
    n = 3 * 256 * 64
    assert lynx_npu.get_codec("bf16").encode(k, v).nbytes() == 2 * n * 2
    assert lynx_npu.get_codec("int8").encode(k, v).nbytes() == 2 * (n + 3 * 256 * 4)
    assert lynx_npu.get_codec("int4").encode(k, v).nbytes() == 2 * (n // 2 + 3 * 256 * 4)
    # kivi4: K scalars per channel per 32 tokens, V per token per head
    assert lynx_npu.get_codec("kivi4").encode(k, v).nbytes() == \
        n + 3 * 8 * 64 * 4 + 3 * 256 * 4
    qs = lynx_npu.get_codec("quantspec").encode(k, v)
    assert qs.nbytes("full") - qs.nbytes("anchor") == n  # two 4-bit lower codes per byte


def test_quantspec_full_refines_the_upper():
    k, v = kv(500, dtype=torch.float32)
    codec = lynx_npu.get_codec("quantspec")
    enc = codec.encode(k, v)
    ka, _ = codec.decode(enc, "anchor")
    kf, _ = codec.decode(enc, "full")
    ea, ef = (ka - k).pow(2).mean(), (kf - k).pow(2).mean()
    assert ef < ea / 100  # 8 bits vs 4 bits: ~256x smaller error


def test_kivi_groups_keys_per_channel():
    k = torch.full((1, 64, 3), -500.0)
    k[0, :, 1] = torch.linspace(0, 1000, 64)  # a huge channel must not hurt the small one
    k[0, :, 0] = torch.linspace(0, 1, 64)
    v = torch.randn(1, 64, 3)
    k2, _ = lynx_npu.get_codec("kivi4").roundtrip(k, v)
    half_step = (31 / 63) / 15 / 2  # a group of 32 tokens spans 31/63 of the small channel
    assert (k2[0, :, 0] - k[0, :, 0]).abs().max() <= half_step * 1.01
    k4, _ = lynx_npu.get_codec("int4").roundtrip(k, v)  # per token: the big channel sets the step
    assert (k4[0, :, 0] - k[0, :, 0]).abs().max() > 10 * half_step


@pytest.mark.parametrize("name", BASELINES)
def test_constant_channels_exact(name):
    k = torch.full((2, 40, 8), -2.5, dtype=torch.float16)
    k2, v2 = lynx_npu.get_codec(name).roundtrip(k, k.clone())
    assert torch.equal(k2, k) and torch.equal(v2, k)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(BASELINES), t=st.integers(1, 90), seed=st.integers(0, 999))
def test_roundtrip_property(name, t, seed):
    k, v = kv(t, seed=seed)
    codec = lynx_npu.get_codec(name)
    k2, v2 = codec.decode(codec.encode(k, v), codec.stages[-1])
    span = k.float().abs().amax() + 1e-3
    assert float((k2.float() - k.float()).abs().max()) <= span / 7


def test_affine_step_matches_grouping():
    x = torch.randn(2, 70, 4)
    _, scale, _ = affine.quantize(x, 4, "channel", 32)
    assert scale.shape == (2, 3, 1, 4)
    assert affine.step(scale, "channel", 70, 32).shape == (2, 70, 4)
