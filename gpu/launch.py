"""Launchers of the Lynx Triton kernels: the ``triton`` backend of lynx_npu.ops.

``supports`` / ``compress`` / ``decompress`` follow ops/torch_backend.py. The launchers check
devices, dtypes and the layout before launching; block sizes derive from the config:
BT = next power of two >= page_size tokens per program, BD channels per program (a multiple of
the chunk along head_dim on the token axis), so one program's tile stays in registers. K and V
are separate launches, each with its own chunk (``cfg.chunk(which)``: chunk_size, v_chunk_size).
Every launch passes ``enable_fp_fusion=False``: the reference rounds each multiply and add.
"""
from __future__ import annotations

import functools
import math
import os
import sys
import threading

import torch
import triton

from lynx_npu.codec import lynx_tables
from lynx_npu.ops import value_flags
from lynx_npu.ops.dest import Destination
from lynx_npu.ops.plan import LayerPlan
from lynx_npu.ops.tables import device_tables, log_search, recip_table, search_tables

from .lynx_compress import lynx_compress_kernel
from .lynx_decompress import lynx_decompress_kernel

NAME = "triton"
# compress refuses NaN / Inf / a page range past float32 itself: the kernel flags them in its
# pass 1 (ops/value_flags.py), so ops.compress runs no aminmax pass first
CHECKS_VALUES = True
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SCALAR_GRIDS = ("float16", "byte")  # LynxConfig.scalar_grid: the compress kernel's BYTE_GRID
MAX_TILE = 16384      # values per program (registers)
MAX_PAGE = 1024
# Launch overrides for tuning runs (python -m lynx_npu.gpu.tune); None keeps the default.
TUNING = {"compress": {"BD": None, "num_warps": None, "RPT": None, "TREE": True, "SMEM": None,
                       "maxnreg": None, "X_WORDS": None, "EVICT": None, "PACK_ASM": None,
                       "POLY": None, "HEADS_FAST": None, "ROW_BLOCKS": None},
          "decompress": {"TB": None, "num_warps": None, "HEADS_FAST": None}}


def _pow2_floor(n: int) -> int:
    """The largest power of two dividing ``n`` (>= 1; 16 at most: a 16-byte vector)."""
    n = int(n)
    return max(1, min(16, n & -n)) if n > 0 else 1


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def _blocks(cfg, head_dim: int, which: str) -> dict:
    """Compress strips: all BT = pow2(page_size) tokens x BD channels (G groups of 8), read
    in steps of RPT groups per thread: CS tokens of every chunk (channel axis) or TS tokens
    (token axis, where BD is a multiple of the chunk along head_dim, CE = GC*8, GT of a
    chunk's groups per thread)."""
    tune = TUNING["compress"]
    return dict(_blocks_for(cfg, head_dim, which, tune["BD"], tune["num_warps"], tune["RPT"]))


@functools.lru_cache(maxsize=256)  # ops.compress runs this on every call (host time)
def _blocks_for(cfg, head_dim: int, which: str, tune_bd, tune_warps, tune_rpt) -> dict:
    bt = _pow2(cfg.page_size)
    c = cfg.chunk(which)
    token = cfg.axis(which) == "token"
    tune = {"BD": tune_bd, "num_warps": tune_warps, "RPT": tune_rpt}
    # Measured on an H100 (docs/benchmarks.md, python -m lynx_npu.gpu.tune). With the
    # midrange centre: on the channel axis NC * G = the thread count, so
    # each thread walks whole chunks (lynx_compress.py), on the token axis 128 channels; with
    # the mean, 64-channel strips (32 where the page is longer than 256 tokens), as its
    # whole-strip load must fit in registers.
    nc = max(bt // c, 1)
    # K (channel axis, midrange): 2 warps, so that the gather's per-step barriers wait on
    # fewer warps (H100: 891 vs 945 us). A K strip keeps 64 channels: pages of 512 (nc 16)
    # take 4 warps, as 2 would narrow it to 32 (H200, head_dim 64: 664 vs 1220 us). V (token
    # axis, midrange): 2 warps for a strip of up to 16K values (H200, 256 tokens x 64 channels:
    # 708 vs 866 us), 4 above (512 x 128: 780 vs 831 us); docs/benchmarks.md
    if cfg.center == "midrange" and not token:
        warps = max(2, min(8, nc // 4))
    elif cfg.center == "midrange":
        warps = 2 if bt * min(128, _pow2(head_dim)) <= 16384 else 4
    else:
        warps = 4
    warps = tune["num_warps"] or warps
    if cfg.center == "midrange" and not token:
        bd = max(8, min(8 * max(32 * warps // nc, 1), _pow2(head_dim)))
    elif cfg.center == "midrange":  # 128-channel strips: the fixed work per strip halves
        bd = max(8, min(128, _pow2(head_dim)))
    else:
        bd = max(8, min(64 if bt <= 256 else 32, _pow2(head_dim)))
    bd = tune["BD"] or bd
    ce = min(c, _pow2(head_dim))
    if token:
        bd = max(bd, ce)
        if bd % ce:
            bd = ce
    g = bd // 8
    # K (channel axis, midrange): 4 groups per thread per step, half the table staging per
    # value (H100: 834 vs 887 us); V keeps 2 (1099 vs 959 us with 4)
    rpt = tune["RPT"] or (4 if cfg.center == "midrange" and not token else 2)
    rows = 32 * warps * rpt  # groups of 8 values per step
    gc = max(ce // 8, 1)
    return {"TOKEN_AXIS": token, "BT": bt, "BD": bd, "G": g, "C": c, "CE": ce,
            "CS": max(1, min(c, rows // (nc * g))),
            # token axis: RPT groups of a chunk per thread, the rest of it across lanes
            "GT": min(gc, rpt), "TS": max(1, min(bt, 32 * warps * min(gc, rpt) // g)),
            "GC": gc, "num_dt": triton.cdiv(head_dim, bd), "num_warps": warps}


def _decode_blocks(cfg, head_dim: int, which: str) -> dict:
    """Decompress tiles: TB tokens x all head_dim channels (G groups of 8). On the channel axis
    TB <= the chunk, so a tile reads one row of chunk statistics."""
    b = _blocks(cfg, head_dim, which)
    tune = TUNING["decompress"]
    g = _pow2(head_dim) // 8
    tb = tune["TB"] or max(8, 4096 // (8 * g))
    if not b["TOKEN_AXIS"]:
        tb = min(tb, b["C"])
    tb = min(tb, b["BT"])
    return {"TOKEN_AXIS": b["TOKEN_AXIS"], "TB": tb, "NTB": triton.cdiv(b["BT"], tb), "G": g,
            "C": b["C"], "EVEN_D": head_dim == 8 * g,
            "num_warps": tune["num_warps"] or 4}


def _regs(which: str) -> dict:
    """Register cap of the K / V compress kernel (ptxas maxnreg), when one is set."""
    cap = TUNING["compress"]["maxnreg"]
    cap = cap.get(which) if isinstance(cap, dict) else cap
    return {"maxnreg": cap} if cap else {}


def _table_in_smem() -> bool:
    """The compress search table through shared memory (tl.gather) or from global memory."""
    smem = TUNING["compress"]["SMEM"]
    return True if smem is None else bool(smem)


def _x_words(x: torch.Tensor) -> bool:
    """Whether compress may read bfloat16 KV as int32 words of two channels (lynx_compress.py
    ``_load_step``): channels contiguous, every other stride and the address even."""
    if TUNING["compress"]["X_WORDS"] is False:
        return False
    return (x.dtype == torch.bfloat16 and x.stride(-1) == 1 and x.data_ptr() % 4 == 0
            and all(s % 2 == 0 for s in x.stride()[:-1]))


def _pack_asm(x: torch.Tensor) -> bool:
    """Whether compress packs 4 + 4 codes with inline PTX (lynx_compress.py ``_pack44``): on a
    GPU, for 16-bit KV, whose rows of 8 values each live in one thread (float32 rows span
    two, and splitting them would go through shared memory)."""
    return (TUNING["compress"]["PACK_ASM"] is not False and not interpreting()
            and x.element_size() == 2)


def supports(cfg, num_kv_heads: int, head_dim: int, dtype) -> str | None:
    tune = TUNING["compress"]
    return _supports(cfg, head_dim, dtype, tune["BD"], tune["num_warps"], tune["RPT"])


@functools.lru_cache(maxsize=256)  # checked by every op call: cached (host time)
def _supports(cfg, head_dim: int, dtype, *tuning) -> str | None:
    if cfg.center not in ("mean", "midrange"):
        return f"center={cfg.center!r}"
    if cfg.scalar_grid not in SCALAR_GRIDS:
        return f"scalar_grid={cfg.scalar_grid!r} (one of {', '.join(SCALAR_GRIDS)})"
    if dtype not in DTYPES:
        return f"dtype {dtype} (float16, bfloat16, float32 only)"
    if head_dim % 8:
        return f"{head_dim=} must be a multiple of 8 (bit-packed rows start on byte boundaries)"
    for which in "kv":
        try:
            log_search(float(cfg.alpha(which)), cfg.y_max(which), cfg.residual_bits(which))
        except ValueError as e:
            return str(e)
    if cfg.page_size > MAX_PAGE:
        return f"page_size={cfg.page_size} must be <= {MAX_PAGE}"
    for which in "kv":  # K and V are launched apart: each tensor's own chunk
        c = cfg.chunk(which)
        chunk = f"{'chunk_size' if which == 'k' else 'v_chunk_size'}={c}"
        if c & (c - 1):
            return f"{chunk} must be a power of two"
        b = _blocks(cfg, head_dim, which)
        whole = not b["TOKEN_AXIS"] and cfg.center == "mean"  # the strip loaded at once
        if whole and b["BT"] * b["BD"] > MAX_TILE:
            return (f"a [{b['BT']}, {b['BD']}] tile of {which.upper()} exceeds {MAX_TILE} "
                    f"values (page_size)")
        if not b["TOKEN_AXIS"] and c > b["BT"]:
            return f"{chunk} exceeds the page"
        if b["TOKEN_AXIS"] and min(c, _pow2(head_dim)) < 8:
            return f"{chunk} along head_dim must be >= 8 (byte-aligned packed rows)"
        if not b["TOKEN_AXIS"] and c * 8 > MAX_TILE:
            return f"{chunk} too large for a decompress tile"
    return None


def interpreting() -> bool:
    """TRITON_INTERPRET=1 runs the kernels on CPU tensors (numpy), for CI."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _check_device(*tensors) -> torch.device:
    dev = tensors[0].device
    want = ("cuda", "cpu") if interpreting() else ("cuda",)
    for t in tensors:
        if t is not None and (t.device != dev or t.device.type not in want):
            raise ValueError(f"the triton backend needs every tensor on one CUDA device; got "
                             f"{t.device} and {dev}")
    return dev


def _views(anchor: torch.Tensor, dtype: torch.dtype):
    """The anchor buffer as uint8, as the KV dtype (gamma, sinks) and as float16 (stats)."""
    es = torch.empty((), dtype=dtype).element_size()
    if anchor.numel() % es:
        raise ValueError(f"anchor of {anchor.numel()} bytes is not a whole number of {dtype}")
    return anchor, anchor.view(dtype), anchor.view(torch.float16), es


_WORD_DTYPES = {1: torch.int8, 2: torch.int16, 4: torch.int32}


def _words(buf: torch.Tensor, bits: int):
    """``buf`` viewed as words of ``bits`` bytes (one word per 8 packed values) and whether the
    kernels may use it (bits in 1, 2, 4 and a whole number of words; section offsets are then
    word multiples since head_dim % 8 == 0)."""
    wd = _WORD_DTYPES.get(bits)
    if wd is None or buf.numel() % bits or buf.data_ptr() % 16:
        return buf, False
    return buf.view(wd), True


# Heads first in the compress grid of a paged cache (rows): the programs running together then
# read every head of the same blocks (NHD: whole token rows) instead of one head of many.
# (H100, 32 x [8, 16384, 128] bf16 NHD, random blocks: 2.09 vs 2.20 ms; docs/benchmarks.md)
HEADS_FAST_PAGED = True


def _heads_fast(paged: bool, num_programs: int) -> bool:
    """Whether the compress grid puts heads first (TUNING overrides; grid dimension 1 holds at
    most 65535 programs)."""
    fast = TUNING["compress"]["HEADS_FAST"]
    return (paged and HEADS_FAST_PAGED if fast is None else bool(fast)) and num_programs <= 65535


# A paged cache's pages whose rows are runs of a block's consecutive rows read from two offsets
# per run (lynx_compress.py ``_run_rows`` / ``_win_rows``, launch MODE 1, which lists the other
# pages) and the listed pages per token (MODE 2). On the H100's data path: 1.85 ms against
# 1.96 (71.3% of copy against 67.3%, medians of 3 alternated rounds, exact;
# docs/benchmarks.md, 2026-11-26 fourth session). TUNING["compress"]["ROW_BLOCKS"] (True /
# False, or per "k" / "v") overrides.
PAGED_RUNS = True


def _row_block(x: torch.Tensor, blk: dict, which: str = "k") -> int:
    """The block size (tokens) the paged compress kernel tries for ``rows`` (lynx_compress.py
    ``_block_phase``): the cache's block size, which is the base view's token extent (the
    callers pass views of the cache at block 0, [heads, block_size, head_dim]); 0 (an offset
    per token) where a thread's run of tokens could span more than one block start. Only a
    guess: the kernel checks each page's offsets and reads per token where they differ.
    Channel axis: a thread walks C / CS consecutive tokens; token axis: a step reads TS
    consecutive tokens (both at most one block start)."""
    on = TUNING["compress"]["ROW_BLOCKS"]
    on = on.get(which) if isinstance(on, dict) else on
    if not (PAGED_RUNS if on is None else on) or x.dim() != 3:
        return 0
    b = int(x.shape[1])
    run = blk["TS"] if blk["TOKEN_AXIS"] else blk["C"] // blk["CS"]
    return b if b >= 2 and b & (b - 1) == 0 and run <= b else 0


def compress(k: torch.Tensor, v: torch.Tensor, plan: LayerPlan, out=None, rows=None,
             previews=None, row_align: int = 1, flags: torch.Tensor | None = None):
    """``rows`` (a paged cache, ops/lynx_serde.py): int64 [num_tokens] element offsets of each
    token's row from k's / v's first element (or a (k rows, v rows) pair), read by the kernel
    in place of ``t * stride`` (the gather fused into compress; k and v are then views of the
    cache at block 0, [heads, block_size, head_dim]: the kernel then reads each run of a
    block's consecutive rows from two offsets, where a page's offsets are such runs; the
    tokens of several layers can be one plan this way); ``row_align``:
    a power of two (elements) dividing every row offset, which keeps the loads vectorized.
    ``previews``: (int64 [num_pages, 2] byte offsets, uint8 [2, 65536] table): the kernel also
    stores the wire's one-byte scalar previews (ops/wire_layout.py).

    Input no page can carry (NaN, Inf, a page channel range past float32) is flagged by the
    kernels (ops/value_flags.py). Without ``flags`` this reads them after the launch (one
    sync) and raises the ValueError naming it; a caller's ``flags`` (``value_flags.new``) are
    only written, for the caller to read where it waits anyway (the page serde's staging)."""
    dev = _check_device(k, v)
    own_flags = flags is None
    if own_flags:
        flags = _thread_flags(dev)
    elif flags.dtype != torch.int32 or tuple(flags.shape) != (2, 2) or flags.device != dev:
        raise ValueError(f"flags must be int32 [2, 2] on {dev}, got {flags.dtype} "
                         f"{tuple(flags.shape)} on {flags.device}")
    cfg = plan.config
    if isinstance(rows, torch.Tensor):
        rows = (rows, rows)
    for r in rows or ():
        _check_device(r)
        if r.dtype != torch.int64 or r.dim() != 1 or r.numel() != plan.num_tokens:
            raise ValueError(f"rows must be int64 [{plan.num_tokens}], got {r.dtype} "
                             f"{tuple(r.shape)}")
    if previews is not None:
        _check_device(*previews)
        if previews[0].shape != (plan.num_pages, 2) or previews[1].shape != (2, 65536):
            raise ValueError(f"previews must be ([{plan.num_pages}, 2] offsets, [2, 65536] "
                             f"table), got {tuple(previews[0].shape)}, "
                             f"{tuple(previews[1].shape)}")
    dummy = _dummy(dev)
    if out is None:
        anchor = torch.empty(plan.anchor_nbytes, dtype=torch.uint8, device=dev)
        residual = torch.empty(plan.residual_nbytes, dtype=torch.uint8, device=dev)
    else:
        anchor, residual = out
    # Every token a sink: no residual bytes; the kernel still needs a valid pointer.
    res_arg = residual if residual.numel() else torch.empty(1, dtype=torch.uint8, device=dev)
    a8, akv, a16, es = _views(anchor, k.dtype)
    searches, polys, search_entries = search_tables(cfg, dev)
    table = plan.on(dev)
    try:
        for wi, (which, x) in enumerate((("k", k), ("v", v))):
            blk = _blocks(cfg, plan.head_dim, which)
            aw, a_words = _words(anchor, cfg.bits(which))   # each tensor its own split
            rw, r_words = _words(res_arg, cfg.residual_bits(which))
            search = searches[wi]
            poly = polys[wi] if TUNING["compress"]["POLY"] is not False else None
            programs = plan.num_pages * blk["num_dt"]
            heads_fast = _heads_fast(rows is not None, programs)
            grid = (plan.num_kv_heads, programs) if heads_fast else (programs, plan.num_kv_heads)
            block = (_row_block(x, blk, which) if rows is not None and cfg.center == "midrange"
                     else 0)
            # runs of rows, then the pages the first launch listed (counted from zero)
            work = torch.zeros(1 + plan.num_pages, dtype=torch.int32, device=dev) \
                if block else dummy
            for mode in ((1, 2) if block else (0,)):
                lynx_compress_kernel[grid](
                    x, *x.stride(), rows[wi] if rows is not None else dummy,
                    previews[0] if previews is not None else dummy,
                    previews[1] if previews is not None else a8, a8, akv, a16, aw, res_arg, rw,
                    table, search_entries[wi], recip_table(dev), sigma_levels(dev), flags, work,
                    plan.num_kv_heads, plan.head_dim, blk["num_dt"],
                    plan.num_pages * plan.num_kv_heads,
                    WHICH=wi, TOKEN_AXIS=blk["TOKEN_AXIS"], BT=blk["BT"], G=blk["G"], C=blk["C"],
                    CS=blk["CS"], GC=blk["GC"], TS=blk["TS"], GT=blk["GT"],
                    BS=_pow2(cfg.num_sink_tokens), ES=es,
                    A_BITS=cfg.bits(which), R_BITS=cfg.residual_bits(which),
                    BIAS=cfg.bias(which),
                    ALPHA=search.alpha, SCALE=search.scale, FLOOR=bool(poly and poly.floor),
                    MIDRANGE=cfg.center == "midrange",
                    TREE=TUNING["compress"]["TREE"], A_WORDS=a_words,
                    R_WORDS=r_words, SEC=plan.section_align, SMEM=_table_in_smem(),
                    EVEN_D=plan.head_dim % blk["BD"] == 0, X_WORDS=_x_words(x),
                    EVICT=TUNING["compress"]["EVICT"] is not False,
                    PACK_ASM=_pack_asm(x), POLY=poly is not None,
                    C1=poly.c1 if poly else 0.0, C2=poly.c2 if poly else 0.0,
                    PAGED=_pow2_floor(row_align) if rows is not None else 0,
                    PREVIEW=previews is not None, HEADS_FAST=heads_fast, BLOCK=block, MODE=mode,
                    BYTE_GRID=cfg.scalar_grid == "byte",
                    num_warps=blk["num_warps"], enable_fp_fusion=False, **_regs(which))
    except BaseException:
        if own_flags:  # a partial launch may have flagged: this thread's next call starts clean
            flags.zero_()
        raise
    if own_flags:
        _raise_flagged(flags.cpu(), plan, k, v, rows, dev)
    return anchor, residual


_LOCAL = threading.local()
_DUMMIES: dict[str, torch.Tensor] = {}
_SIGMA_LEVELS: dict[str, torch.Tensor] = {}


def sigma_levels(device) -> torch.Tensor:
    """float32 [256] on ``device`` (cached): the byte grid's sigma levels
    (lynx_tables.sigma_levels), which the compress kernel searches where BYTE_GRID."""
    key = str(device)
    if key not in _SIGMA_LEVELS:
        _SIGMA_LEVELS[key] = lynx_tables.sigma_levels(device)
    return _SIGMA_LEVELS[key]


def _thread_flags(device) -> torch.Tensor:
    """This thread's flags buffer for ``compress`` calls that read their own: each call reads
    it before returning, and only a refusal leaves it nonzero (``_raise_flagged`` clears it),
    so the next call of the thread takes it as it is: no allocation or memset per call."""
    cache = _LOCAL.__dict__.setdefault("flags", {})
    key = str(device)
    if key not in cache:
        cache[key] = value_flags.new(device)
    return cache[key]


def _dummy(device) -> torch.Tensor:
    """A valid pointer for the kernel arguments a launch does not use (never read or written)."""
    key = str(device)
    if key not in _DUMMIES:
        _DUMMIES[key] = torch.zeros(2, dtype=torch.int64, device=device)
    return _DUMMIES[key]


def _raise_flagged(flags: torch.Tensor, plan: LayerPlan, k, v, rows, device) -> None:
    """Raise what the kernels flagged: the reference's message, naming the first bad value's
    index, where k and v are the layer itself (a pass over them on this error path only)."""
    err = value_flags.error(flags, plan)
    if err is None:
        return
    _thread_flags(device).zero_()
    if rows is None:
        from lynx_npu.ops.api import check_values
        check_values(k, v)  # raises, naming the value
    raise err


def decompress(anchor: torch.Tensor, residual: torch.Tensor | None, plan: LayerPlan,
               dest: Destination, layer_offsets: torch.Tensor | None = None,
               layer_align: int = 1) -> None:
    """``layer_offsets`` (pages of several layers in one launch, ops/lynx_serde.py): int64
    [num_pages, 2], the element offset of each page's K / V layer cache from ``dest``'s;
    ``layer_align``: a power of two (elements) dividing all of them."""
    dev = _check_device(anchor, residual, dest.k.tensor, dest.v.tensor)
    if dest.tiled:  # (WRITES_TILES is not set: the serde and ops.decompress_paged go dense)
        raise ValueError("the Triton kernels write untiled caches; a tiled one (vllm_cpu_amx) "
                         "takes a dense pair and scatter_tokens (ops.decompress_paged does)")
    if layer_offsets is not None:
        _check_device(layer_offsets)
        if layer_offsets.dtype != torch.int64 or layer_offsets.shape != (plan.num_pages, 2):
            raise ValueError(f"layer_offsets must be int64 [{plan.num_pages}, 2], got "
                             f"{layer_offsets.dtype} {tuple(layer_offsets.shape)}")
    cfg = plan.config
    if dest.dtype != plan.dtype:
        raise ValueError(f"destination dtype {dest.dtype} differs from the stream's {plan.dtype}")
    a8, akv, a16, es = _views(anchor, plan.dtype)
    tabs = device_tables(cfg, dev)
    table = plan.on(dev)
    has_res = residual is not None and residual.numel() > 0
    r8 = residual if has_res else a8
    slots = dest.slot_mapping if dest.slot_mapping is not None else table
    bs = dest.block_size
    bs_shift = bs.bit_length() - 1 if bs & (bs - 1) == 0 else -1
    slots32 = dest.num_blocks * bs < 2 ** 31  # 32-bit slot arithmetic: every slot fits
    for wi, (which, tgt) in enumerate((("k", dest.k), ("v", dest.v))):
        blk = _decode_blocks(cfg, plan.head_dim, which)
        aw, a_words = _words(anchor, cfg.bits(which))   # each tensor its own split
        rw, r_words = _words(r8, cfg.residual_bits(which)) if has_res else (a8, False)
        # Programs run roughly in grid order, dimension 0 fastest: token tiles, then heads.
        # HEADS_FAST (tuning only) puts heads first, so that programs running together write
        # a token's neighbouring head rows of a paged cache; on the H100 it was slower
        # (docs/benchmarks.md). Grid dimension 1 holds at most 65535.
        tiles = plan.num_pages * blk["NTB"]
        heads_fast = bool(TUNING["decompress"]["HEADS_FAST"]) and tiles <= 65535
        grid = (plan.num_kv_heads, tiles) if heads_fast else (tiles, plan.num_kv_heads)
        align = math.gcd(tgt.s_block, tgt.s_token, 16) if tgt.s_dim == 1 else 1
        lynx_decompress_kernel[grid](
            a8, akv, a16, aw, r8, rw, table,
            tabs["signed_levels" if has_res else "anchor_levels"][wi],
            tgt.tensor, tgt.offset, tgt.s_block, tgt.s_token, tgt.s_head, tgt.s_dim,
            dest.block_size, dest.num_blocks * bs, slots,
            layer_offsets if layer_offsets is not None else table, plan.num_kv_heads,
            plan.head_dim,
            WHICH=wi, TOKEN_AXIS=blk["TOKEN_AXIS"], NTB=blk["NTB"], TB=blk["TB"], G=blk["G"],
            C=blk["C"], BS=_pow2(cfg.num_sink_tokens), ES=es, A_BITS=cfg.bits(which),
            R_BITS=cfg.residual_bits(which), HAS_RES=has_res, PAGED=dest.slot_mapping is not None,
            INTERPRET=interpreting(), ALIGN=align, A_WORDS=a_words, R_WORDS=r_words,
            EVEN_D=blk["EVEN_D"], SEC=plan.section_align, BS_SHIFT=bs_shift,
            SLOTS32=slots32,
            HEADS_FAST=heads_fast,
            LAYERED=_pow2_floor(layer_align) if layer_offsets is not None else 0,
            num_warps=blk["num_warps"], enable_fp_fusion=False)


def load():
    return sys.modules[__name__]
