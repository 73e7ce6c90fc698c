"""The ``triton`` backend (gpu/) against the reference codec, on a GPU or Triton's interpreter.

On a CUDA machine the kernels run compiled; elsewhere they run under TRITON_INTERPRET=1 (CI
sets it) on CPU tensors with small shapes. Same checks as tests/ops/test_cpu_kernel.py: bytes
equal to the reference (both chunk centres, both scalar grids), decompression equal to the
reference decoder, poisoned outputs, every paged layout, pages on their own, and streams
interchangeable with the cpu backend.
"""
import importlib.util
import os

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (pip install 'lynx_npu[triton]')", allow_module_level=True)
CUDA = torch.cuda.is_available()
if not CUDA and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA device; set TRITON_INTERPRET=1 to run the Triton kernels on the CPU "
                "interpreter (ci/test.sh does)", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from lynx_npu import ops  # noqa: E402
from lynx_npu.codec import lynx_ref, lynx_tables  # noqa: E402
from lynx_npu.codec.lynx_config import LynxConfig  # noqa: E402
from lynx_npu.gpu.launch import sigma_levels  # noqa: E402
from lynx_npu.gpu.lynx_compress import SIGMA_B, SIGMA_PER_LOG2, _stats  # noqa: E402
from lynx_npu.ops import KV_CACHE_LAYOUTS  # noqa: E402

from ..ops.parity import (CENTERS, codec, poisoned_compress, random_kv,  # noqa: E402
                          reference_streams)
from ..ops.test_cpu_kernel import check_pages, check_paged  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
SPLITS = [2, 3, 4, 6]
# The interpreter is slow: small pages and heads there, the default config on a GPU.
SMALL = dict(page_size=64, chunk_size=16) if not CUDA else {}
SIZES = [1, 31, 33, 150] if not CUDA else [1, 31, 257, 1000, 2100]
HEADS, HEAD_DIM = (1, 32) if not CUDA else (2, 128)


def config(anchor_bits=4, v_axis="token", sinks=4, center="midrange", **kw):
    return LynxConfig(center=center, anchor_bits=anchor_bits, v_axis=v_axis,
                      k_axis="token" if v_axis == "channel" else "channel",
                      num_sink_tokens=sinks, **{**SMALL, **kw})


CASES = [(ab, axis, sinks, dtype, center)
         for ab in SPLITS for axis in ("channel", "token") for sinks in (0, 4)
         for dtype in (torch.bfloat16, torch.float16) for center in CENTERS
         if (ab + (axis == "token") + sinks // 4 + (dtype == torch.float16)
             + (center == "mean")) % 2 == 0]


@pytest.mark.parametrize("anchor_bits,v_axis,sinks,dtype,center", CASES)
def test_compress_bytes(anchor_bits, v_axis, sinks, dtype, center):
    cfg = config(anchor_bits, v_axis, sinks, center)
    for t in SIZES:
        k, v = random_kv(HEADS, t, HEAD_DIM, dtype, seed=t)
        got = poisoned_compress(k.to(DEVICE), v.to(DEVICE), cfg, "triton")
        want = reference_streams(cfg, k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"{t} tokens"


@pytest.mark.parametrize("anchor_bits,v_axis,dtype", [
    (2, "channel", torch.bfloat16), (3, "token", torch.float16), (4, "token", torch.bfloat16),
    (6, "channel", torch.float16), (4, "channel", torch.float32)])
def test_decompress_equals_reference(anchor_bits, v_axis, dtype):
    cfg = config(anchor_bits, v_axis, 4)
    for t in SIZES[:3] + SIZES[-1:]:
        k, v = random_kv(HEADS, t, HEAD_DIM, dtype, seed=t)
        a, r = reference_streams(cfg, k, v)
        enc = codec(cfg)._wrap(tuple(k.shape), dtype, a, r)
        for stage, res in (("anchor", None), ("full", r)):
            out = tuple(torch.full(k.shape, float("nan"), dtype=dtype, device=DEVICE) for _ in "kv")
            gk, gv = ops.decompress(a.to(DEVICE), res.to(DEVICE) if res is not None else None,
                                    cfg, k.shape, dtype, backend="triton", out=out)
            wk, wv = codec(cfg).decode(enc, stage)
            assert torch.equal(gk.cpu(), wk) and torch.equal(gv.cpu(), wv), (t, stage)


# K and V with chunks of their own (launch.py: each tensor's launch takes its own chunk): V
# chunks of 64 along head_dim (the planned default: one chunk per token-head at head_dim 64,
# two at 128), and V on the channel axis with chunks twice K's.
K_CHUNK = config().chunk_size
PER_TENSOR_CHUNKS = [("token", 64, 64, "midrange", torch.bfloat16),
                     ("token", 64, 128, "midrange", torch.bfloat16),
                     ("token", 64, 128, "mean", torch.float16),
                     ("channel", 2 * K_CHUNK, HEAD_DIM, "midrange", torch.float16),
                     ("channel", 2 * K_CHUNK, HEAD_DIM, "mean", torch.bfloat16)]


@pytest.mark.parametrize("v_axis,v_chunk,head_dim,center,dtype", PER_TENSOR_CHUNKS)
def test_per_tensor_chunks_equal_reference(v_axis, v_chunk, head_dim, center, dtype):
    """Compressed bytes and both decompressed stages equal the reference."""
    cfg = config(v_axis=v_axis, center=center, v_chunk_size=v_chunk)
    assert cfg.chunk("v") != cfg.chunk("k")
    for t in SIZES[:2] + SIZES[-1:]:
        k, v = random_kv(HEADS, t, head_dim, dtype, seed=t)
        a, r = poisoned_compress(k.to(DEVICE), v.to(DEVICE), cfg, "triton")
        want = reference_streams(cfg, k, v)
        assert torch.equal(a, want[0]) and torch.equal(r, want[1]), f"{t} tokens"
        enc = codec(cfg)._wrap(tuple(k.shape), dtype, a, r)
        for stage, res in (("anchor", None), ("full", r)):
            out = tuple(torch.full(k.shape, float("nan"), dtype=dtype, device=DEVICE) for _ in "kv")
            gk, gv = ops.decompress(a.to(DEVICE), res.to(DEVICE) if res is not None else None,
                                    cfg, k.shape, dtype, backend="triton", out=out)
            wk, wv = codec(cfg).decode(enc, stage)
            assert torch.equal(gk.cpu(), wk) and torch.equal(gv.cpu(), wv), (t, stage)


# The launch geometry moves with the page (launch.py _blocks_for): a K strip of 64 channels
# takes 2 warps at pages of 256, 4 at 512, 8 at 1024; a V strip 2 warps up to 16K values, 4
# above. Each geometry, at SmolLM2's head_dim, against the reference.
@pytest.mark.parametrize("page_size,head_dim", [(256, 64), (512, 64), (1024, 64)])
def test_page_geometries_equal_reference(page_size, head_dim):
    cfg = LynxConfig(page_size=page_size, v_chunk_size=64)
    t = 100  # one page: the geometry is the page's, whatever the tokens
    k, v = random_kv(1, t, head_dim, torch.bfloat16, seed=page_size)
    a, r = poisoned_compress(k.to(DEVICE), v.to(DEVICE), cfg, "triton")
    want = reference_streams(cfg, k, v)
    assert torch.equal(a, want[0]) and torch.equal(r, want[1])
    wk, wv = codec(cfg).decode(codec(cfg)._wrap(tuple(k.shape), k.dtype, a, r), "full")
    gk, gv = ops.decompress(a.to(DEVICE), r.to(DEVICE), cfg, k.shape, k.dtype, backend="triton")
    assert torch.equal(gk.cpu(), wk) and torch.equal(gv.cpu(), wv)


# K and V with splits of their own (launch.py: each tensor's launch takes its own bits and
# tables): the K-only wide anchor of a calibrated layer (5 + 3 beside 4 + 4), and the reverse.
PER_TENSOR_SPLITS = [(5, 4, "token", torch.bfloat16), (4, 5, "token", torch.float16),
                     (6, 3, "channel", torch.bfloat16), (2, 7, "token", torch.float32)]


@pytest.mark.parametrize("k_bits,v_bits,v_axis,dtype", PER_TENSOR_SPLITS)
def test_per_tensor_splits_equal_reference(k_bits, v_bits, v_axis, dtype):
    """Compressed bytes and both decompressed stages equal the reference."""
    cfg = config(anchor_bits=k_bits, v_anchor_bits=v_bits, v_axis=v_axis)
    for t in SIZES[:2] + SIZES[-1:]:
        k, v = random_kv(HEADS, t, HEAD_DIM, dtype, seed=t)
        a, r = poisoned_compress(k.to(DEVICE), v.to(DEVICE), cfg, "triton")
        want = reference_streams(cfg, k, v)
        assert torch.equal(a, want[0]) and torch.equal(r, want[1]), f"{t} tokens"
        enc = codec(cfg)._wrap(tuple(k.shape), dtype, a, r)
        for stage, res in (("anchor", None), ("full", r)):
            out = tuple(torch.full(k.shape, float("nan"), dtype=dtype, device=DEVICE) for _ in "kv")
            gk, gv = ops.decompress(a.to(DEVICE), res.to(DEVICE) if res is not None else None,
                                    cfg, k.shape, dtype, backend="triton", out=out)
            wk, wv = codec(cfg).decode(enc, stage)
            assert torch.equal(gk.cpu(), wk) and torch.equal(gv.cpu(), wv), (t, stage)


def test_refuses_a_v_chunk_not_a_power_of_two():
    cfg = config(v_chunk_size=48)
    k, v = random_kv(HEADS, 8, HEAD_DIM, torch.bfloat16)
    with pytest.raises(ops.BackendUnavailable, match="v_chunk_size=48 must be a power of two"):
        ops.compress(k.to(DEVICE), v.to(DEVICE), cfg, backend="triton")


@pytest.mark.parametrize("layout", sorted(KV_CACHE_LAYOUTS))
def test_decompress_paged_every_layout(layout):
    check_paged(layout, "full", "triton", DEVICE, h=HEADS, t=90 if not CUDA else 1000,
                d=HEAD_DIM)


def test_decompress_each_page_alone():
    check_pages("full", "triton", DEVICE, h=HEADS, t=300 if not CUDA else 1100, d=HEAD_DIM)


def test_streams_interchange_with_the_cpu_backend():
    if ops.list_backends()["cpu"]:
        pytest.skip(f"cpu backend unavailable: {ops.list_backends()['cpu']}")
    cfg = config(center="mean")
    k, v = random_kv(HEADS, 200, HEAD_DIM, torch.bfloat16, seed=9)
    ta, tr = ops.compress(k.to(DEVICE), v.to(DEVICE), cfg, backend="triton")
    ca, cr = ops.compress(k, v, cfg, backend="cpu")
    assert torch.equal(ta.cpu(), ca) and torch.equal(tr.cpu(), cr)  # same order, same bytes
    for res_t, res_c in ((None, None), (tr, cr)):
        tk, tv = ops.decompress(ca.to(DEVICE), res_c.to(DEVICE) if res_c is not None else None,
                                cfg, k.shape, k.dtype, backend="triton")
        ck, cv = ops.decompress(ta.cpu(), res_t.cpu() if res_t is not None else None, cfg,
                                k.shape, k.dtype, backend="cpu")
        assert torch.equal(tk.cpu(), ck) and torch.equal(tv.cpu(), cv)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_compress_bytes_extreme_values(dtype):
    """Values at the edges of the normalisation: a page min of exactly 0 (and one that is tiny)
    beside nonzero values, a huge page range (a reciprocal near the float32 limit), a constant
    channel (reciprocal 0); and sign-of-zero cases (chunks where x == mu, an all-zero channel)."""
    cfg = config(center="midrange")
    k, v = random_kv(HEADS, 70, HEAD_DIM, torch.float32, seed=3)
    finfo = torch.finfo(dtype)
    k[:, :, 0] = k[:, :, 0].abs()
    k[:, 5:9, 0] = 0.0                                   # page min exactly 0
    k[:, :, 1] = finfo.tiny * torch.arange(1, 71).float()  # tiny values (subnormal steps above)
    k[:, 3, 2] = finfo.max / 4                           # huge range (scale > 2**24)
    k[:, 4, 2] = -finfo.max / 4
    k[:, :, 3] = 1.5                                     # constant channel
    v[:, :, :8] = 0.0                                    # all-zero chunk along head_dim
    v[:, 7, :] = 2.0                                     # x == mu for a whole token
    k, v = k.to(dtype), v.to(dtype)
    got = poisoned_compress(k.to(DEVICE), v.to(DEVICE), cfg, "triton")
    want = reference_streams(cfg, k, v)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("v_axis", ["token", "channel"])
def test_compress_bytes_ragged_head_dim_and_strided_input(v_axis):
    """bfloat16 KV is read as int32 words of two channels where the layout allows it
    (launch.py ``_x_words``), else value by value: a head_dim that leaves the strip partly
    masked (24: words with masks), and views with an odd token stride or an address two bytes
    past a word (values), give the reference's bytes."""
    cfg = config(v_axis=v_axis)
    k, v = random_kv(HEADS, 70, 24, torch.bfloat16, seed=24)
    got = poisoned_compress(k.to(DEVICE), v.to(DEVICE), cfg, "triton")
    want = reference_streams(cfg, k, v)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), "head_dim 24"
    kw, vw = (x.to(DEVICE) for x in random_kv(HEADS, 70, HEAD_DIM + 1, torch.bfloat16, seed=5))
    k, v = kw[..., 1:], vw[..., :HEAD_DIM]  # odd address / odd token stride
    got = poisoned_compress(k, v, cfg, "triton")
    want = reference_streams(cfg, k.cpu(), v.cpu())
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), "strided views"


@pytest.mark.parametrize("alpha_k,alpha_v", [(1e5, 3000.0), (0.01, 255.0)])
def test_compress_bytes_log_search(alpha_k, alpha_v):
    """The log code search (ops/tables.py LogSearch) of large alphas (1e5, 3000, 255; K's 0.01
    takes the quadratic) on the end cells' half-step grid."""
    cfg = LynxConfig(alpha_k=alpha_k, alpha_v=alpha_v, **SMALL)
    for t in SIZES[:2] + SIZES[-1:]:
        k, v = random_kv(HEADS, t, HEAD_DIM, torch.bfloat16, seed=t)
        got = poisoned_compress(k.to(DEVICE), v.to(DEVICE), cfg, "triton")
        want = reference_streams(cfg, k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"{t} tokens"


def test_refuses_an_alpha_too_small_for_the_log_search():
    cfg = LynxConfig(alpha_k=1e-6, **SMALL)
    k, v = random_kv(HEADS, 8, HEAD_DIM, torch.bfloat16)
    with pytest.raises(ops.BackendUnavailable, match="too small for the log-search"):
        ops.compress(k.to(DEVICE), v.to(DEVICE), cfg, backend="triton")


def test_paged_skips_slots_past_the_cache():
    """A device slot_mapping is not read back to check it (ops/api.py): the kernel skips
    slots past the cache, as negative ones, and writes nothing outside it."""
    import dataclasses

    from lynx_npu.gpu import launch
    from lynx_npu.ops import dest as _dest
    from lynx_npu.ops.kv_layouts import every_token, resolve
    from lynx_npu.ops.plan import layer_plan

    cfg = config()
    t, bs = 90, 16
    k, v = random_kv(HEADS, t, HEAD_DIM, torch.bfloat16, seed=3)
    a, r = reference_streams(cfg, k, v)
    wk, wv = codec(cfg).decode(codec(cfg)._wrap(tuple(k.shape), k.dtype, a, r), "full")
    nb = -(-t // bs) + 3
    small = nb - 2  # the kernel is told the cache ends here; the rest is a guard
    top = small * bs
    slots = torch.arange(t)
    slots[5], slots[6], slots[7] = top, top + 17, -1
    rc = resolve("vllm_flash_nhd", KV_CACHE_LAYOUTS["vllm_flash_nhd"].allocate(
        nb, bs, HEADS, HEAD_DIM, torch.bfloat16, DEVICE, fill=-7.0))
    dest = dataclasses.replace(_dest.paged(rc, slots.to(DEVICE)), num_blocks=small)
    launch.decompress(a.to(DEVICE), r.to(DEVICE), layer_plan(cfg, HEADS, t, HEAD_DIM, k.dtype),
                      dest)
    keep = (slots >= 0) & (slots < top)
    for tgt, want in ((rc.k, wk), (rc.v, wv)):
        flat = every_token(tgt, nb, bs, HEADS, HEAD_DIM).cpu()
        assert torch.equal(flat[slots[keep]], want.transpose(0, 1)[keep])
        untouched = torch.ones(nb * bs, dtype=torch.bool)
        untouched[slots[keep]] = False
        assert bool((flat[untouched] == -7.0).all()), "a slot outside the cache was written"


@pytest.mark.skipif(not CUDA, reason="compiled path only: under the interpreter "
                    "lynx_compress._sigma_recip divides (numpy); on a GPU it uses rcp.approx "
                    "with a Newton step, or the reciprocal table")
@pytest.mark.parametrize("table", [False, True])
def test_sigma_reciprocal_is_exact_for_every_float16(table):
    """The compress kernel's 1 / sigma equals the IEEE float32 division for every finite
    float16 sigma >= 0 (0 gives 0), both ways it is computed."""
    import triton
    import triton.language as tl

    from lynx_npu.gpu.lynx_compress import _sigma_recip
    from lynx_npu.ops.tables import recip_table

    @triton.jit
    def recip_kernel(s_ptr, o_ptr, recip_ptr, TABLE: tl.constexpr):
        i = tl.program_id(0) * 1024 + tl.arange(0, 1024)
        tl.store(o_ptr + i, _sigma_recip(tl.load(s_ptr + i), recip_ptr, TABLE))

    bits = torch.arange(0, 0x7C00, dtype=torch.int32).to(torch.int16)  # +0 .. float16 max
    sigma = bits.view(torch.float16).to(DEVICE)
    out = torch.empty(sigma.shape, dtype=torch.float32, device=DEVICE)
    recip_kernel[(sigma.numel() // 1024,)](sigma, out, recip_table(sigma.device), TABLE=table,
                                          enable_fp_fusion=False)
    s = sigma.cpu().double()
    want = torch.where(s > 0, 1.0 / s, 0.0).float()  # double rounding is exact for division
    assert torch.equal(out.cpu(), want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_largest_finite_inputs_decompress_finite_and_as_the_reference(dtype):
    """Issue 18: float16 at +-65504 decoded to Inf (rounded scalars overshoot by a hair);
    the kernel saturates to the dtype's finite range as the reference decoder does."""
    cfg = config(center="midrange")
    top = 65504.0 if dtype == torch.float16 else 2.0 ** 126
    g = torch.Generator().manual_seed(5)
    k = ((torch.rand(HEADS, 150, HEAD_DIM, generator=g) * 2 - 1) * top).to(dtype)
    k[:, 10], k[:, 11] = top, -top
    v = k.flip(1).contiguous()
    a, r = reference_streams(cfg, k, v)
    enc = codec(cfg)._wrap(tuple(k.shape), dtype, a, r)
    for stage, res in (("anchor", None), ("full", r)):
        wk, wv = codec(cfg).decode(enc, stage)
        assert bool(torch.isfinite(wk).all() and torch.isfinite(wv).all()), stage
        gk, gv = ops.decompress(a.to(DEVICE), res.to(DEVICE) if res is not None else None,
                                cfg, k.shape, dtype, backend="triton")
        assert torch.equal(gk.cpu(), wk) and torch.equal(gv.cpu(), wv), stage


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_compress_refuses_non_finite_input(bad):
    """Issue 18: ops.compress accepted NaN / Inf (one +Inf turned 256 outputs NaN)."""
    cfg = config()
    k, v = random_kv(HEADS, 70, HEAD_DIM, torch.bfloat16, seed=4)
    v[0, 69, 3] = bad
    with pytest.raises(ValueError, match=r"v contains NaN or Inf \(first at index \(0, 69, 3\)"):
        ops.compress(k.to(DEVICE), v.to(DEVICE), cfg, backend="triton")


# -- the byte scalar grid (LynxConfig.scalar_grid, lynx_tables.py) ----------------------------------

GRIDS = ["float16", "byte"]
# Both centres, K and V each on both chunk axes, every KV dtype, and head_dim 40: the last chunk
# along head_dim (token axis) ragged, 8 of 32 values; 31 tokens and SIZES' last: ragged last
# pages and chunks along tokens.
GRID_CASES = [("token", "midrange", torch.bfloat16, HEAD_DIM),
              ("channel", "midrange", torch.float16, HEAD_DIM + 8),
              ("token", "mean", torch.float32, HEAD_DIM + 8),
              ("channel", "mean", torch.bfloat16, HEAD_DIM)]


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("v_axis,center,dtype,head_dim", GRID_CASES)
def test_compress_bytes_scalar_grid(grid, v_axis, center, dtype, head_dim):
    """Compressed bytes equal the reference's on either scalar grid; on the byte grid they
    differ from the float16 grid's (a kernel ignoring the grid fails)."""
    cfg = config(v_axis=v_axis, center=center, scalar_grid=grid)
    for t in SIZES[1:2] + SIZES[-1:]:
        k, v = random_kv(HEADS, t, head_dim, dtype, seed=t)
        got = poisoned_compress(k.to(DEVICE), v.to(DEVICE), cfg, "triton")
        want = reference_streams(cfg, k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"{t} tokens"
        if grid == "byte" and t > cfg.num_sink_tokens:
            other = reference_streams(cfg.replace(scalar_grid="float16"), k, v)
            assert not torch.equal(want[0], other[0]), "the grids gave the same bytes"


def _grid_edge_kv(dtype, t, d, sinks, page, chunk):
    """KV whose chunks hit the byte grid's edges. Integers in [0, 256] with both ends in every
    page (first two body tokens, both in the page's first chunk along tokens): page-normalised
    values are k / 256 exactly, so chunk centres fall on ties ((a + b) / 512 with a + b odd:
    round half up) and needs on levels (4 / 256 = 2^-6, 128 / 256 = 1/2: the search's
    ``levels[j] < need`` at equality); K channels 0-7 and all of V. K also: chunks constant
    at values off the grid (sigma the least nonzero level), at the page max (mu clamped to
    255 / 256) and at the page min (sigma 0), a constant channel, chunks spanning the page
    channel's whole range with one value at the max (the mean's need past the top level),
    and such chunks over odd ranges (the normalised max a hair above or below 1). V also:
    tokens constant at 0, 256, 76.5 (a tie off the integers) and alternately 0 / 256."""
    g = torch.Generator().manual_seed(11)
    k, _ = random_kv(HEADS, t, d, torch.float32, seed=11)
    ints = torch.randint(0, 257, (HEADS, t, d), generator=g).float()
    starts = list(range(sinks, t, page))
    for s0 in starts:
        ints[:, s0], ints[:, s0 + 1] = 0.0, 256.0
    v = ints.clone()
    k[:, :, :8] = ints[:, :, :8]
    for s0 in starts:
        for c0 in range(s0, min(s0 + page, t), chunk):
            k[:, c0:c0 + chunk, 8] = float(torch.rand((), generator=g)) * 3 - 1
        k[:, s0:s0 + chunk, 8] = 2.0  # the page max: normalised 1
        k[:, s0 + chunk:s0 + 2 * chunk, 8] = -1.0  # the page min: normalised 0
        k[:, s0:min(s0 + page, t), 10] = 0.3 + 0.3 * torch.rand(
            HEADS, min(page, t - s0), generator=g)
        k[:, s0:s0 + chunk, 10] = 0.0
        k[:, s0 + 1, 10] = 1.0
    k[:, :, 9] = 1.5  # a constant channel: normalised 0
    lo = torch.rand(HEADS, 1, 6, generator=g) * 10 - 5
    span = torch.rand(HEADS, 1, 6, generator=g) * 7 + 0.01
    k[:, :, 11:17] = lo + span * torch.rand(HEADS, t, 6, generator=g)
    for s0 in starts:  # the page channel's ends in its first chunk
        k[:, s0, 11:17], k[:, s0 + 1, 11:17] = lo[:, 0], (lo + span)[:, 0]
    for s0 in starts:
        if s0 + 6 < t:
            v[:, s0 + 2], v[:, s0 + 3], v[:, s0 + 4] = 0.0, 256.0, 76.5
            v[:, s0 + 5, 0::2], v[:, s0 + 5, 1::2] = 0.0, 256.0
    return k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("grid,center,dtype", [
    (grid, center, dtype) for grid in GRIDS for center in CENTERS
    for dtype in (torch.bfloat16, torch.float16, torch.float32)
    if grid == "byte" or (dtype == torch.bfloat16) == (center == "midrange")])
def test_compress_bytes_scalar_grid_edges(grid, center, dtype):
    """The byte grid's edges (``_grid_edge_kv``) give the reference's bytes; the data reaches
    them: mu 255 / 256 and sigma 0, 2^-6, 1/2 (and, with the mean, the top level)."""
    cfg = config(center=center, scalar_grid=grid)
    page, chunk, sinks = cfg.page_size, cfg.chunk_size, cfg.num_sink_tokens
    t = 2 * page + sinks + 18  # a ragged last page
    k, v = _grid_edge_kv(dtype, t, HEAD_DIM, sinks, page, chunk)
    got = poisoned_compress(k.to(DEVICE), v.to(DEVICE), cfg, "triton")
    want = reference_streams(cfg, k, v)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    if grid == "byte":
        body = slice(sinks, sinks + page)
        _, _, _, sk = lynx_ref.quantize(k[:, body].unsqueeze(0), cfg, "k")
        _, _, _, sv = lynx_ref.quantize(v[:, body].unsqueeze(0), cfg, "v")
        mus = set(torch.cat([sk[0, 0], sv[0, 0]]).float().tolist())
        sigmas = set(torch.cat([sk[0, 1], sv[0, 1]]).float().tolist())
        lv = lynx_tables.sigma_levels().tolist()
        assert 255 / 256 in mus and {0.0, lv[1], lv[254]} <= sigmas, (mus, sigmas)
        if center == "mean":
            assert lv[255] in sigmas


def _centre_cases() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(centre, lo, hi) float32 rows for the grid's scalars: sigma at every level, a float32
    step either side of it and the geometric midpoint to the next (where the estimate's
    rounding changes), needs in (0, 2^-6] (subnormals too), above the top level (Inf too) and
    random needs (centre 0 = mu, lo 0, so need = hi);
    then mu's rounding at every tie (n + 1/2) / 256 and a step either side, the top (clamped
    to 255 / 256) and random centres (lo = hi = centre: need = |centre - mu|)."""
    g = torch.Generator().manual_seed(7)
    lv = lynx_tables.sigma_levels()
    inf = torch.tensor(float("inf"))
    top = lynx_tables.SIGMA_TOP
    need = torch.cat([lv, torch.nextafter(lv, inf), torch.nextafter(lv[1:], -inf),
                      torch.sqrt(lv[1:-1] * lv[2:]),
                      torch.tensor([1e-45, 1e-40, 1e-30, 2.0 ** -7, 0.75, 1.0, 2.0,
                                    torch.finfo(torch.float32).max, float("inf")]),
                      torch.exp2(-6 - torch.rand(500, generator=g) * 120),
                      top + torch.rand(500, generator=g) * 2.0 ** -6,
                      torch.rand(2000, generator=g) * 0.6,
                      torch.exp2(torch.rand(2000, generator=g) * -12)])
    ties = (torch.arange(256, dtype=torch.float32) + 0.5) / 256
    cen = torch.cat([ties, torch.nextafter(ties, inf), torch.nextafter(ties, -inf),
                     torch.arange(257, dtype=torch.float32) / 256,
                     torch.tensor([0.0, 1e-30, 1.0 + 2.0 ** -23, 1.25]),
                     torch.rand(2000, generator=g)])
    centre = torch.cat([torch.zeros_like(need), cen])
    lo = torch.cat([torch.zeros_like(need), cen])
    hi = torch.cat([need, cen])
    n = -(-centre.numel() // 1024) * 1024  # whole blocks: pad with the last row
    pad = lambda x: torch.cat([x, x[-1:].expand(n - x.numel())]).contiguous()  # noqa: E731
    return pad(centre), pad(lo), pad(hi)


@triton.jit
def _grid_stats_kernel(c_ptr, lo_ptr, hi_ptr, mu_ptr, sigma_ptr, slev_ptr):
    """The compress kernel's byte-grid ``_stats`` of 1024 (centre, lo, hi) rows a program (the
    mean's csum / count with count 1: the centre itself)."""
    i = tl.program_id(0) * 1024 + tl.arange(0, 1024)
    c = tl.load(c_ptr + i)
    mu, sigma = _stats(tl.load(lo_ptr + i), tl.load(hi_ptr + i), c,
                       tl.full(c.shape, 1.0, tl.float32), False, True, slev_ptr)
    tl.store(mu_ptr + i, mu)
    tl.store(sigma_ptr + i, sigma)


def test_scalar_grid_stats_equal_the_reference():
    """The kernel's byte-grid scalars (``_stats``: mu's rounding, ``_sigma_on_grid``'s log2
    estimate and its correction) equal lynx_tables' for centres and needs at, around and
    between every tie and level."""
    centre, lo, hi = _centre_cases()
    mu = torch.empty(centre.shape, dtype=torch.float16, device=DEVICE)
    sigma = torch.empty_like(mu)
    _grid_stats_kernel[(centre.numel() // 1024,)](
        centre.to(DEVICE), lo.to(DEVICE), hi.to(DEVICE), mu, sigma, sigma_levels(mu.device),
        enable_fp_fusion=False)
    want_mu = lynx_tables.mu_on_grid(centre)
    need = torch.maximum(hi - want_mu, want_mu - lo)
    want_sigma = lynx_tables.sigma_levels()[lynx_tables.sigma_index(need)]
    assert torch.equal(mu.cpu(), want_mu.half())
    assert torch.equal(sigma.cpu(), want_sigma.half())
    assert len(set(want_sigma.tolist())) == 256  # every level reached


def test_scalar_grid_sigma_estimate_margin():
    """``_sigma_on_grid``'s premise: level j's position in log2, f = SIGMA_B + log2(level) *
    SIGMA_PER_LOG2, is within 0.036 of j for j = 1 .. 254 (float16 rounding of the levels),
    so round(f(need)) is idx - 1 or idx with a margin of 0.46 (lg2.approx: ~2^-22 relative);
    the top level is clamped to."""
    lv = lynx_tables.sigma_levels().double()
    f = SIGMA_B.value + torch.log2(lv[1:255]) * SIGMA_PER_LOG2.value
    assert (f - torch.arange(1, 255, dtype=torch.float64)).abs().max().item() < 0.036


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("center,runs", [("midrange", True), ("midrange", False),
                                         ("mean", False)])
def test_paged_compress_scalar_grid(monkeypatch, grid, center, runs):
    """A paged cache compressed through the page serde (the gather fused into the kernel,
    the wire's scalar bytes stored by it): a page's rows as runs of a block's rows (launch
    MODE 1) or per token (the page with two tokens swapped: MODE 2; runs off: MODE 0) give
    the reference's pages on either grid."""
    from lynx_npu.codec.lynx_config import make_config
    from lynx_npu.gpu import launch

    from ..ops.serde_checks import block_slots, check_encode_slots
    monkeypatch.setitem(launch.TUNING["compress"], "ROW_BLOCKS", runs)
    # blocks of 32 rows, head_dim 64: both K's and V's launches try runs (the interpreter's
    # small pages); the GPU's pages with blocks of 16
    kw = dict(page_size=64, chunk_size=16, d=64) if not CUDA else dict(page_size=256,
                                                                      chunk_size=32, d=128)
    bs = 32 if not CUDA else 16
    d = kw.pop("d")
    cfg = make_config(center=center, scalar_grid=grid, **kw)
    if runs:
        for which in "kv":
            assert launch._row_block(torch.empty(2, bs, d), launch._blocks(cfg, d, which),
                                     which) == bs
    page, sinks = cfg.page_size, cfg.num_sink_tokens
    t = 2 * page + sinks + 40
    slots = block_slots(t, -(-t // bs) + 3, bs, "random", seed=6).clone()
    a = sinks + page + 10  # two tokens of page 1 swapped: that page per token
    slots[[a, a + 11]] = slots[[a + 11, a]]
    assert check_encode_slots("lynx", "vllm_flash_nhd", slots, DEVICE, "triton", block_size=bs,
                              h=HEADS, d=d, center=center, scalar_grid=grid, **kw) == "triton"


def test_supports_each_scalar_grid():
    """Both grids are supported; a grid the kernel does not know is refused with a reason."""
    from lynx_npu.gpu import launch
    for grid in GRIDS:
        assert launch.supports(config(scalar_grid=grid), HEADS, HEAD_DIM, torch.bfloat16) is None
    cfg = config()
    object.__setattr__(cfg, "scalar_grid", "int4")  # past LynxConfig's own check
    assert "scalar_grid='int4'" in launch.supports(cfg, HEADS, HEAD_DIM, torch.bfloat16)
