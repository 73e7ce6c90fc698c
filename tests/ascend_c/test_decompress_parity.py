"""Decompress kernels (host build) vs the reference decoder: bit-identical K, V.

Dense [H, T, D] output for the anchor and full stages, and the paged variant that writes
straight into vLLM-Ascend's separate K / V caches [num_blocks, block_size, H, D] by slot.
Decompression reads mu and sigma from the stream, so it does not depend on the chunk centre;
streams of both centres are decoded all the same (their statistics differ).
"""
import pytest
import torch

from lynx_npu.codec.lynx import LynxCodec

from .parity import SPLIT_BITS, SPLIT_CHUNKS, SPLIT_SHAPES, random_kv

DTYPES = [torch.bfloat16, torch.float16]
CENTERS = ["midrange", "mean"]
CONFIGS = [
    ("default", {}),
    ("paper", {}),
    ("default", {"page_size": 64, "chunk_size": 16, "num_sink_tokens": 3}),
]
SHAPES = [(2, 1, 16), (1, 37, 64), (3, 200, 16), (2, 517, 64)]


def _ids(val):
    return str(val).replace("torch.", "").replace(" ", "")


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int16)


@pytest.mark.parametrize("center", CENTERS)
@pytest.mark.parametrize("stage", ["anchor", "full"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("preset,overrides", CONFIGS, ids=_ids)
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_dense_output_is_bit_identical(host_build, center, stage, dtype, preset, overrides, shape):
    codec = LynxCodec(preset, **{**overrides, "center": center})
    k, v = random_kv(*shape, dtype, seed=2)
    enc = codec.encode(k, v)
    want_k, want_v = codec.decode(enc, stage)
    got_k, got_v = host_build.decompress(enc.anchor, enc.residual, shape, dtype, codec.config, stage=stage)
    assert torch.equal(_bits(got_k), _bits(want_k))
    assert torch.equal(_bits(got_v), _bits(want_v))


@pytest.mark.parametrize("center", CENTERS)
@pytest.mark.parametrize("stage", ["anchor", "full"])
@pytest.mark.parametrize("overrides", SPLIT_CHUNKS, ids=_ids)
@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=_ids)
def test_k_and_v_chunks_of_their_own_decode_bit_identical(host_build, center, stage, overrides, shape):
    codec = LynxCodec("default", **overrides, center=center)
    k, v = random_kv(*shape, torch.bfloat16, seed=2)
    enc = codec.encode(k, v)
    want_k, want_v = codec.decode(enc, stage)
    got_k, got_v = host_build.decompress(enc.anchor, enc.residual, shape, torch.bfloat16, codec.config, stage=stage)
    assert torch.equal(_bits(got_k), _bits(want_k))
    assert torch.equal(_bits(got_v), _bits(want_v))


@pytest.mark.parametrize("stage", ["anchor", "full"])
@pytest.mark.parametrize("v_axis", ["token", "channel"])
@pytest.mark.parametrize("split", SPLIT_BITS, ids=_ids)
@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=_ids)
def test_k_and_v_splits_of_their_own_decode_bit_identical(host_build, stage, v_axis, split, shape):
    codec = LynxCodec("default", **split, v_axis=v_axis)
    k, v = random_kv(*shape, torch.bfloat16, seed=2)
    enc = codec.encode(k, v)
    want_k, want_v = codec.decode(enc, stage)
    got_k, got_v = host_build.decompress(enc.anchor, enc.residual, shape, torch.bfloat16, codec.config, stage=stage)
    assert torch.equal(_bits(got_k), _bits(want_k))
    assert torch.equal(_bits(got_v), _bits(want_v))


@pytest.mark.parametrize("center", CENTERS)
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64], ids=_ids)
@pytest.mark.parametrize("stage", ["anchor", "full"])
# V's own chunk, and K, V splits of their own
@pytest.mark.parametrize("overrides", [{}, {"v_chunk_size": 64}, SPLIT_BITS[2]], ids=_ids)
def test_paged_output_lands_in_the_slots(host_build, center, slot_dtype, stage, overrides):
    codec = LynxCodec(center=center, page_size=64, chunk_size=16, **overrides)
    h, t, d, block_size, num_blocks = 2, 150, 32, 16, 16
    k, v = random_kv(h, t, d, torch.bfloat16, seed=3)
    enc = codec.encode(k, v)
    want_k, want_v = codec.decode(enc, stage)
    g = torch.Generator().manual_seed(0)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:t].to(slot_dtype)
    slots[7] = -1                                   # vLLM's padding slot: must be skipped
    k_cache = torch.zeros(num_blocks, block_size, h, d, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    host_build.decompress_paged(enc.anchor, enc.residual, k_cache, v_cache, slots, t, codec.config, stage=stage)
    for cache, want in ((k_cache, want_k), (v_cache, want_v)):
        flat = cache.view(-1, h, d)
        live = slots >= 0
        assert torch.equal(_bits(flat[slots[live].long()]), _bits(want.transpose(0, 1)[live]))
        untouched = torch.ones(flat.shape[0], dtype=torch.bool)
        untouched[slots[live].long()] = False
        assert not flat[untouched].any()


def test_rejects_wrong_streams(host_build):
    codec = LynxCodec()
    k, v = random_kv(2, 40, 32, torch.float16)
    enc = codec.encode(k, v)
    with pytest.raises(ValueError, match="bytes; the layout needs"):
        host_build.decompress(enc.anchor[:-1], enc.residual, (2, 40, 32), torch.float16)
    with pytest.raises(ValueError, match="needs the residual"):
        host_build.decompress(enc.anchor, None, (2, 40, 32), torch.float16, stage="full")
    cache = torch.zeros(4, 16, 2, 32, dtype=torch.float16)
    with pytest.raises(ValueError, match="slot_mapping"):
        host_build.decompress_paged(enc.anchor, enc.residual, cache, cache.clone(),
                                    torch.zeros(40, dtype=torch.float32), 40)


@pytest.mark.parametrize("stage", ["anchor", "full"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_the_largest_finite_inputs_decode_finite_and_identical(host_build, stage, dtype):
    """Issue 18: float16 at +-65504 used to decode to Inf (rounded scalars overshoot by a
    hair); the kernel saturates to the dtype's finite range as the reference does."""
    top = 65504.0 if dtype == torch.float16 else 2.0 ** 126
    codec = LynxCodec("default", page_size=64, chunk_size=16)
    g = torch.Generator().manual_seed(5)
    k = ((torch.rand(2, 150, 64, generator=g) * 2 - 1) * top).to(dtype)
    k[:, 10], k[:, 11] = top, -top
    v = k.flip(1).contiguous()
    enc = codec.encode(k, v)
    want_k, want_v = codec.decode(enc, stage)
    assert bool(torch.isfinite(want_k).all() and torch.isfinite(want_v).all())
    got_k, got_v = host_build.decompress(enc.anchor, enc.residual, tuple(k.shape), dtype,
                                         codec.config, stage=stage)
    assert torch.equal(_bits(got_k), _bits(want_k))
    assert torch.equal(_bits(got_v), _bits(want_v))
