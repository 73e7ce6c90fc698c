import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import lynx_npu
from lynx_npu.codec import cachegen  # noqa: F401  (registers "cachegen")
from lynx_npu.codec.cachegen import CacheGenConfig
from lynx_npu.codec.cachegen_coder import (FREQ_TOTAL, cdf_table, decode_symbols,
                                           encode_symbols, table_frequencies)
from lynx_npu.codec.registry import codec_from_wire, wire_params

RAGGED = [1, 31, 33, 255, 257, 1000]


def laplace_kv(t, h=3, d=64, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(2, h, t, d, generator=g) - 0.5
    x = -torch.sign(u) * torch.log1p(-2 * u.abs()) * torch.linspace(0.2, 4, d)
    return x[0].to(dtype), x[1].to(dtype)


def codec(**kw):
    return lynx_npu.get_codec("cachegen", **kw)


def assert_within_half_bin(x, x2, bins):
    """CacheGen's step is max|token| / (bins // 2 - 1); rounding errs by at most half of it."""
    h, t, d = x.shape
    peak = x.float().abs().amax(dim=(0, 2), keepdim=True)
    half = 0.5 * peak / (bins // 2 - 1)
    err = (x2.float() - x.float()).abs()
    assert bool((err <= half * (1 + 1e-5) + 1e-6 * peak).all()), float((err - half).max())


# -- the entropy coder -------------------------------------------------------------------------

def test_coder_round_trips_symbols_exactly():
    rng = np.random.default_rng(0)
    n = 31
    skewed = np.clip(np.round(rng.laplace(size=(300, 40)) * 2 + 15), 0, n - 1).astype(np.int32)
    skewed[:, 0] = 7                       # one symbol only
    skewed[:, 1] = np.arange(300) % n      # every symbol
    skewed[:, 2] = np.r_[np.zeros(299), [n - 1]]  # one rare symbol at the alphabet's edge
    uniform = rng.integers(0, 15, size=(5, 40)).astype(np.int32)
    groups = [(skewed, cdf_table(skewed, n)), (uniform, cdf_table(uniform, 15))]
    words = encode_symbols(groups)
    assert words.dtype == np.uint32
    back = decode_symbols(words, [(300, groups[0][1]), (5, groups[1][1])])
    assert np.array_equal(back[0], skewed) and np.array_equal(back[1], uniform)
    with pytest.raises(ValueError):  # fewer symbols than were coded: words are left over
        decode_symbols(words, [(300, groups[0][1])])


def test_cdf_table_keeps_every_seen_symbol_and_sums_exactly():
    rng = np.random.default_rng(1)
    sym = rng.integers(0, 31, size=(1000, 8)).astype(np.int32) % np.arange(1, 9)  # 1..8 symbols
    table = cdf_table(sym, 31)
    assert table.dtype == np.uint16 and table.shape == (8, 30)
    freq = table_frequencies(table)
    assert (freq.sum(axis=1) == FREQ_TOTAL).all()
    seen = np.stack([np.bincount(sym[:, c], minlength=31) > 0 for c in range(8)])
    assert ((freq > 0) == seen).all()


def test_entropy_coded_size_tracks_the_empirical_entropy():
    rng = np.random.default_rng(2)
    p = np.array([0.7, 0.2, 0.05, 0.05])
    sym = rng.choice(4, size=(4096, 16), p=p).astype(np.int32)
    words = encode_symbols([(sym, cdf_table(sym, 4))])
    entropy_bits = -(p * np.log2(p)).sum() * sym.size
    assert entropy_bits * 0.97 < 32 * words.size < entropy_bits * 1.03


# -- the codec ---------------------------------------------------------------------------------

@pytest.mark.parametrize("layer,num_layers,kb,vb", [
    (0, 30, 32, 32), (1, 30, 32, 32), (2, 30, 32, 16), (9, 30, 32, 16), (10, 30, 16, 16),
    (29, 30, 16, 16), (5, 8, 32, 32)])
def test_bins_by_layer_follow_lmcache(layer, num_layers, kb, vb):
    cfg = CacheGenConfig(layer_index=layer, num_layers=num_layers)
    assert (cfg.key_bins, cfg.value_bins) == (kb, vb)


def test_for_layer_keeps_the_other_parameters():
    c = codec(chunk_size=64, key_second_bins=8).for_layer(12, 24)
    assert (c.config.layer_index, c.config.num_layers, c.config.chunk_size) == (12, 24, 64)
    assert c.config.key_bins == 8


@pytest.mark.parametrize("layer", [0, 5, 20])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_error_within_half_a_bin(layer, dtype):
    c = codec(layer_index=layer)
    k, v = laplace_kv(300, dtype=dtype, seed=layer)
    k2, v2 = c.decode(c.encode(k, v))
    assert k2.dtype == dtype and v2.shape == v.shape
    if dtype != torch.float32:  # the output cast adds one rounding of the output dtype
        k2, v2 = k2.float(), v2.float()
        k, v = k.float(), v.float()
    slack = {torch.float32: 0, torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11}[dtype]
    for x, x2, bins in ((k, k2, c.config.key_bins), (v, v2, c.config.value_bins)):
        exact = cachegen.dequantize(*cachegen.quantize(x, bins), bins, *x.shape[::2], torch.float32)
        assert ((x2 - exact).abs() <= exact.abs() * slack).all()
        assert_within_half_bin(x, exact, bins)


def test_size_is_the_serialized_length():
    c = codec(layer_index=12)  # 16 bins for K and V: 14 CDF points per channel
    k, v = laplace_kv(600, dtype=torch.bfloat16)
    enc = c.encode(k, v)
    pages = c.encode_pages(k, v)
    assert [p.token_end for p in pages] == [256, 512, 600]
    assert all(p.residual is None and p.anchor.dtype == torch.uint8 for p in pages)
    assert enc.nbytes() == sum(p.anchor.numel() for p in pages)
    for p, buf in zip(pages, enc.pages):
        t = p.token_end - p.token_start
        k_sym, _ = cachegen.quantize(k[:, p.token_start:p.token_end], 16)
        v_sym, _ = cachegen.quantize(v[:, p.token_start:p.token_end], 16)
        words = encode_symbols([(k_sym, cdf_table(k_sym, 15)), (v_sym, cdf_table(v_sym, 15))])
        fixed = 4 + 2 * 2 * t + 2 * (192 * 14 * 2)  # bins, maxes (bf16), two CDF tables
        assert p.anchor.numel() == fixed + 4 * words.size
        assert torch.equal(p.anchor, buf)
    assert enc.bits_per_value() == 8 * enc.nbytes() / (2 * 3 * 600 * 64)


def test_pages_decode_alone_and_match_the_layer_decode():
    c = codec()
    k, v = laplace_kv(700, dtype=torch.float16)
    k2, v2 = c.decode(c.encode(k, v))
    for p in c.encode_pages(k, v):
        kp, vp = c.decode_page(p.anchor, None, p.token_start, p.token_end,
                               num_kv_heads=3, head_dim=64, dtype=torch.float16)
        assert torch.equal(kp, k2[:, p.token_start:p.token_end])
        assert torch.equal(vp, v2[:, p.token_start:p.token_end])


def test_deterministic_and_rebuilt_from_the_wire():
    c = codec(layer_index=3, num_layers=30)
    k, v = laplace_kv(257)
    a, b = c.encode(k, v), c.encode(k, v)
    assert all(torch.equal(x, y) for x, y in zip(a.pages, b.pages))
    other = codec_from_wire(c.codec_id, wire_params(c))
    assert other.params() == c.params()
    assert all(torch.equal(x, y) for x, y in zip(c.decode(a), other.decode(a)))


@pytest.mark.parametrize("tokens", RAGGED)
def test_ragged_token_counts(tokens):
    c = codec()
    k, v = laplace_kv(tokens, seed=tokens)
    enc = c.encode(k, v)
    k2, v2 = c.decode(enc)
    assert k2.shape == k.shape and v2.shape == v.shape
    assert len(enc.pages) == -(-tokens // 256)
    assert_within_half_bin(k, k2, 32)
    assert_within_half_bin(v, v2, 32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_constant_and_zero_input_round_trip_exactly(dtype):
    c = codec(layer_index=20)
    const = torch.full((2, 40, 8), -3.25, dtype=dtype)
    zero = torch.zeros(2, 40, 8, dtype=dtype)
    k2, v2 = c.decode(c.encode(const, zero))
    assert torch.equal(k2, const) and torch.equal(v2, zero)


def test_each_tokens_peak_and_constant_peak_channel_are_exact():
    # The scale is per token (LMCache), so the value that sets it maps to the edge bin exactly;
    # a constant channel that holds every token's peak therefore round-trips exactly.
    k, v = laplace_kv(100)
    k[1, :, 5] = 50.0
    v[0, :, 0] = -50.0
    k2, v2 = codec().decode(codec().encode(k, v))
    assert torch.equal(k2[1, :, 5], k[1, :, 5]) and torch.equal(v2[0, :, 0], v[0, :, 0])


def test_bad_input_raises_value_error():
    c = codec()
    k, v = laplace_kv(10)
    nan = k.clone()
    nan[0, 3, 1] = float("nan")
    bad = [(nan, v), (k[0], v[0]), (k, v[:, :5]), (k[:, :0], v[:, :0]),
           (k.to(torch.int32), v.to(torch.int32)), (k.to(torch.float16), v)]
    for a, b in bad:
        with pytest.raises(ValueError):
            c.encode(a, b)
        with pytest.raises(ValueError):
            c.encode_pages(a, b)


@pytest.mark.parametrize("kw", [dict(layer_index=30), dict(layer_index=-1), dict(num_layers=0),
                                dict(key_first_bins=3), dict(value_second_bins=300),
                                dict(chunk_size=0), dict(key_second_layers=5), dict(bits=4)])
def test_bad_parameters_raise_value_error(kw):
    with pytest.raises(ValueError):
        codec(**kw)


def test_corrupt_pages_raise_value_error():
    c = codec()
    k, v = laplace_kv(40)
    page = c.encode_pages(k, v)[0].anchor
    kw = dict(num_kv_heads=3, head_dim=64, dtype=torch.float32)
    with pytest.raises(ValueError):
        c.decode_page(page[:-3], None, 0, 40, **kw)   # not whole words
    with pytest.raises(ValueError):
        c.decode_page(page[:100], None, 0, 40, **kw)  # shorter than the side channels
    with pytest.raises(ValueError):
        c.decode_page(page, page, 0, 40, **kw)        # one-stream codec: no residual
    with pytest.raises(ValueError):
        c.decode_page(page, None, 0, 41, **kw)        # wrong token count
    with pytest.raises(ValueError):                   # trailing words
        c.decode_page(torch.cat([page, torch.full((8,), 7, dtype=torch.uint8)]), None, 0, 40, **kw)


@settings(max_examples=25, deadline=None)
@given(h=st.integers(1, 3), t=st.integers(1, 70), d=st.integers(1, 9),
       layer=st.integers(0, 29), scale=st.floats(1e-3, 1e3), seed=st.integers(0, 2 ** 16))
def test_round_trip_property(h, t, d, layer, scale, seed):
    c = codec(layer_index=layer, chunk_size=32)
    k, v = laplace_kv(t, h, d, seed=seed)
    k, v = k * scale, v * scale
    k2, v2 = c.decode(c.encode(k, v))
    assert_within_half_bin(k, k2, c.config.key_bins)
    assert_within_half_bin(v, v2, c.config.value_bins)
