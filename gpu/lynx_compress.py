"""Triton: Lynx compress, fused (lynx_npu/codec/lynx_ref.py ``quantize`` + the v1 page layout).

One program = one page x one kv head x one strip of BD channels, for K or V (WHICH). It reads
its [tokens, BD] input strip twice (min / max, then codes: the second read hits L1 / L2 because
of eviction hints: pass 1 loads evict-last, pass 2 loads and the code stores evict-first;
without them a quarter to a half of the re-read came from DRAM) and writes each output once: gamma, chunk statistics, packed anchor and residual codes, the
page-0 sink tokens and (one program per page) the zero alignment padding. Byte offsets come
from the page plan (lynx_npu/ops/plan.py).

The strip is held as [..., G, 8]: a thread owns groups of 8 consecutive channels of a token
(16-byte loads; one word of packed codes per stream), and only two tile-wide reductions remain:

* channel axis (K): chunk c of a channel is C consecutive tokens; a step of the strip is
  [CS, NC, G, 8] with token = nc*C + cs*NIT + k at step k (NIT = C / CS steps). With the
  launcher's BD a thread holds the CS tokens of its (chunk, group) and walks the chunk, so
  the chunk reduction stays in registers. Normalisation xn = RN(RN(x - gmin) * RN(1 / scale)) is
  monotone in x, so the chunk's min / max of xn are xn(min x), xn(max x): one min/max
  reduction of the raw values gives the page min/max (gamma) and every chunk's lo / hi.
* token axis (V): a chunk is CE = GC*8 channels of a token; each channel has its own gmin and
  scale, so the page min/max reduce over tokens, then the chunk lo / hi over the normalised
  values: a step is [GT, TS, NCD, GL, 8], GT groups of a chunk in a thread's registers and
  GL = GC / GT neighbouring lanes (``_token_rows``).

A paged cache (PAGED: the launcher's row offsets, the gather fused into the loads) is read in
two launches when the launcher names a block size (launch.py ``PAGED_RUNS``, on by default):
MODE 1 codes the pages whose offsets are runs of a block's consecutive rows (``_block_phase``,
checked per program), each thread's rows computed from two offsets per run loaded once
(``_run_rows``, channel axis) or two scalars per step (``_win_rows``, token axis), with no
offset load and no shared-memory conversion in the loops, and lists the other pages; MODE 2
codes the listed pages, an offset per token (its other programs return after one load: a
re-check of every page there cost about a tenth of the request). Per-token code inside MODE 1's loops, even where never executed, made them slower.

Rows past the page body read its last token (``_load_rows``): no masks on full pages. Pass 2
loads each step's rows one step ahead (bfloat16 as int32 words of two channels), in a loop
unrolled by two so that the prefetched rows need no register copies.

Then mu = f16((hi + lo) / 2) (MIDRANGE) or f16(pairwise tree sum / count) (mean, the
reference's order: lynx_ref.tree_sum), and sigma = f16(max |xn - mu|) =
f16(max(RN(hi - mu), RN(mu - lo))) (RN(. - mu) is monotone), with no per-value |.| or max;
on the byte grid (BYTE_GRID, LynxConfig.scalar_grid "byte", lynx_tables.py) mu = the float32
centre rounded to u / 256 and sigma = the least of 256 levels >= that max, found per chunk
from its log2 (``_sigma_on_grid``: one lg2.approx gives the level's index or one less, two
independent loads from the 1 KB level table at ``slev_ptr``, which stays in L1, and one compare
settle it exactly), both exact float16 values (a constexpr branch: the float16 grid's code is
unchanged);
xf = RN(RN(xn - mu) * RN(1 / sigma)). Both reciprocals are computed once per channel / chunk.
Codes, the full stage's end cells included (lynx_ref: an end cell's code I is split at its
level, h = |xf| >= split[I]): a quadratic in |xf| (small alphas, ops/tables.py ``PolySearch``)
or Eq. (3) in float32 (one lg2.approx, ``LogSearch``) estimates 2y, the count F of half-step
thresholds <= |xf| (I = (F + 1) >> 1, h = 1 - (F & 1)), within one; one threshold from the
search table (in shared memory through tl.gather) settles it exactly. 4+4 fields of 16-bit KV
(``_codes`` PRMT): the comparison leaves F + 16 / F + 15 in a byte, and byte permutes and word
operations in inline PTX decode four of them at once into anchor and residual nibbles and pack
them (``_pack44``); else each entry's high word holds the code bytes of both outcomes and the
comparison picks one, packed from byte words with word masks.
``TREE=False`` (benchmarks only) sums the mean with tl.sum instead, to measure what the fixed
order costs.

Input no page can carry (lynx_ref.quantize refuses it) is flagged, not pre-checked: pass 1's
min / max propagate NaN, so a channel's page min or max is not finite exactly when one of its
values is NaN or Inf, and a finite pair whose difference overflows float32 is the reference's
range error; sink tokens are tested as they are copied. One test per channel and one atomic
per program write the first bad (page, head) to ``flags_ptr`` (ops/value_flags.py), read by the
caller where it waits anyway: no second pass over the KV.
"""
import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

from lynx_npu.codec import lynx_tables
from lynx_npu.ops import plan as P
from lynx_npu.ops import tables as T

from .lynx_common import (minmax_combine, minmax_nan_combine, moved_bits, pmax, pmin, section,
                          split_columns)

F_TOKEN0 = tl.constexpr(P.F_TOKEN0)
F_BODY0 = tl.constexpr(P.F_BODY0)
F_NUM_BODY = tl.constexpr(P.F_NUM_BODY)
F_NUM_SINK = tl.constexpr(P.F_NUM_SINK)
F_CODES = tl.constexpr(P.F_CODES)
F_GAMMA = tl.constexpr(P.F_GAMMA)
F_STATS = tl.constexpr(P.F_STATS)
F_SINK = tl.constexpr(P.F_SINK)
F_RES = tl.constexpr(P.F_RES)
F_PADS = tl.constexpr(P.F_PADS)
NUM_PADS = tl.constexpr(P.NUM_PADS)
NF = tl.constexpr(P.NUM_FIELDS)
MAGIC = tl.constexpr(T.MAGIC)  # y + MAGIC rounds y to an integer, in the low mantissa bits
MAGIC_BITS = tl.constexpr(T.MAGIC_BITS)  # float32 bits of MAGIC
SEARCH_LEN = tl.constexpr(T.SEARCH_LEN)
MU_STEPS = tl.constexpr(lynx_tables.MU_STEPS)  # BYTE_GRID: mu = u / MU_STEPS
# BYTE_GRID: levels[1 + u] = f16(2^(SIGMA_LOW_LOG2 + u / SIGMA_PER_LOG2)), u = 0 .. 253
SIGMA_PER_LOG2 = 253.0 / (-1.0 - lynx_tables.SIGMA_LOW_LOG2)
SIGMA_B = tl.constexpr(1.0 - lynx_tables.SIGMA_LOW_LOG2 * SIGMA_PER_LOG2)  # the index at need 1
SIGMA_PER_LOG2 = tl.constexpr(SIGMA_PER_LOG2)
# triton.jit reads TRITON_INTERPRET at import, as here: the interpreter has no fast_log2f
INTERPRET = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def _codes(xf, tab, search_ptr, ALPHA: tl.constexpr, SCALE: tl.constexpr, FLOOR: tl.constexpr,
           RS: tl.constexpr, SMEM: tl.constexpr, PRMT: tl.constexpr, POLY: tl.constexpr,
           C1: tl.constexpr, C2: tl.constexpr):
    """The codes of xf [RS, 8] (int32), lynx_ref's end cells included (ops/tables.py, "the GPU
    compress kernel's code search"): an estimate n of 2y (Eq. (3) doubled: POLY, the quadratic
    C1 a + C2 a**2 rounded to nearest, or FLOOR toward -inf + 1; else the log, one
    lg2.approx) is F or F + 1, F = #{half-step thresholds <= |xf|}, and one comparison with
    the low word of the search table's entry n settles F: d = bits(a) - word, d >> 30 in
    0 .. -2. Then
    * PRMT (4 + 4, 16-bit KV): v = n + 16 + (d >> 30) in the low byte (F + 16 in cell 0, F + 15
      after; the upper bytes as they are), which ``_pack44`` decodes four at a time; the table
      is the entries' low words (1 KB), the comparison one fused shift-add as before the end
      cells;
    * else the code byte (m << R_BITS) | (field ^ bias): byte (d >> 30) & 3 of the entry's high
      word (one byte permute where PRMT adds).
    Why not the field from (I, h) per value: ~8 more integer ops a value cost 28% of the
    H200's compress throughput, 8-byte entries everywhere (twice the shared-memory wavefronts
    per lookup) 15%; ``_pack44``'s decoding is 2 ops a value. The table is ``tab`` in registers
    (tl.gather goes through shared memory) if SMEM, else read from global memory."""
    OFF: tl.constexpr = 16 if PRMT else 0
    a = tl.minimum(tl.abs(xf), 1.0)
    if POLY:
        r = tl.fma(a, C2, C1)
        if not FLOOR:  # round(r * a) in the low mantissa bits: one fma
            w = tl.fma(r, a, tl.full(a.shape, MAGIC + OFF, tl.float32))
        elif INTERPRET:  # r * a is rounded once more here: far inside PolySearch's margin
            w = tl.floor(r * a) + (MAGIC + 1 + OFF)
        else:  # fma rounding toward -inf: floor(r * a) + MAGIC + 1 in one op
            w = tl.inline_asm_elementwise("fma.rm.f32 $0, $1, $2, $3;", "=f,f,f,f",
                                          [r, a, tl.full(a.shape, MAGIC + 1 + OFF, tl.float32)],
                                          dtype=tl.float32, is_pure=True, pack=1)
    else:
        p = tl.fma(a, ALPHA, 1.0)
        if INTERPRET:  # numpy log2 (the interpreter has no fast_log2f); the result is the same
            lg = tl.log2(p)
        else:  # lg2.approx (one MUFU op; tl.log2 is libdevice's accurate polynomial)
            lg = libdevice.fast_log2f(p)
        w = tl.fma(lg, SCALE, MAGIC + OFF)  # round(scale * lg): no bias (LogSearch)
    wb = w.to(tl.int32, bitcast=True)
    n = wb - (MAGIC_BITS + OFF)
    ab = a.to(tl.int32, bitcast=True)  # a and the words stay within 2^30 of each other
    if PRMT:
        if SMEM:
            t = tl.reshape(tl.gather(tab, tl.reshape(n, [RS * 8]), 0), [RS, 8])
        else:
            t = tl.load(search_ptr.to(tl.pointer_type(tl.int32)) + 2 * n)
        return wb + ((ab - t) >> 30)  # (MAGIC_BITS' low 16 bits are 0)
    if SMEM:
        e = tl.reshape(tl.gather(tab, tl.reshape(n, [RS * 8]), 0), [RS, 8])
    else:
        e = tl.load(search_ptr + n)
    d = ab - e.to(tl.int32)
    c = (e >> 32).to(tl.int32)
    if INTERPRET:
        return (c >> (((d >> 30) & 3) * 8)) & 255
    else:  # byte d >>> 30 of c
        u = tl.inline_asm_elementwise(
            "{ .reg .b32 s; shr.u32 s, $2, 30; prmt.b32 $0, $1, 0, s; }", "=r,r,r", [c, d],
            dtype=tl.int32, is_pure=True, pack=1)
        return u & 255


# 4 + 4 packing of one group of 8 codes in PTX (``_pack44``): PRMT gathers the low bytes of the
# even / odd values' v (``_codes``) into two words and replicates each value's float32 sign
# bit into a byte (selector nibbles 0xB / 0xF: byte 3 of the first / second operand,
# sign-extended), so a value's sign costs a fraction of a byte permute instead of a compare
# and a predicated xor. Each word W then decodes four v at once (r = 4, F = 2 I - 1 + h):
#   anchor m = v >> 5 in every cell: bits 4-6 of h = W >> 1;
#   residual nibble (field ^ bias): in a middle cell, v = F + 15: I + 7 = v >> 1 (as before
#   the end cells); in an end cell (field = -F mod 16), F + 7 = v + 7 in cell 0 (v = F + 16;
#   v = 31 is F = 2^r, which codes as 2^r - 1) and v + 8 in the top cell (v >= 128);
#   middle: bits 5-7 of v not all equal (cell 0 is v < 32, the top cell v >= 224): (W ^ h)
#   bits 5 / 6 summed into bit 7 and sign-replicated by one PRMT (selector 0xBA98).
# Operands: $0 anchor word, $1 residual word (before the bias); $2-$9 v0..v7, $10-$17 the
# values xf0..xf7 (as int32 bits).
_DECODE44 = """shr.b32 h, {w}, 1;
xor.b32 y, {w}, h;
and.b32 y, y, 0x60606060;
add.u32 y, y, 0x60606060;
prmt.b32 y, y, 0, 0xBA98;
shr.b32 x, {w}, 7;
and.b32 x, x, 0x01010101;
add.u32 x, x, {w};
add.u32 x, x, 0x07070707;
and.b32 {q}, h, y;
not.b32 y, y;
and.b32 x, x, y;
or.b32 {q}, {q}, x;
and.b32 {a}, h, 0x70707070;
xor.b32 {a}, {a}, {s};
"""
_PACK44_ASM = tl.constexpr("""{
.reg .b32 ea, eb, e, oa, ob, o, sa, sb, se, so, t, h, y, x, qe, qo, ae, ao;
prmt.b32 ea, $2, $4, 0x0040;
prmt.b32 eb, $6, $8, 0x0040;
prmt.b32 e, ea, eb, 0x5410;
prmt.b32 oa, $3, $5, 0x0040;
prmt.b32 ob, $7, $9, 0x0040;
prmt.b32 o, oa, ob, 0x5410;
prmt.b32 sa, $10, $12, 0x00FB;
prmt.b32 sb, $14, $16, 0x00FB;
prmt.b32 se, sa, sb, 0x5410;
prmt.b32 sa, $11, $13, 0x00FB;
prmt.b32 sb, $15, $17, 0x00FB;
prmt.b32 so, sa, sb, 0x5410;
""" + _DECODE44.format(w="e", q="qe", a="ae", s="se")
    + _DECODE44.format(w="o", q="qo", a="ao", s="so") + """
shr.b32 t, ae, 4;
and.b32 t, t, 0x0F0F0F0F;
and.b32 $0, ao, 0xF0F0F0F0;
or.b32 $0, $0, t;
shl.b32 t, qo, 4;
and.b32 t, t, 0xF0F0F0F0;
and.b32 $1, qe, 0x0F0F0F0F;
or.b32 $1, $1, t;
}""")
_PACK44_CONSTRAINTS = tl.constexpr(",".join(["=r"] * 2 + ["r"] * 16))


@triton.jit
def _pack44(v, xf, RS: tl.constexpr):
    """(anchor word, residual word before the bias) [RS] of ``_codes``' v [RS, 8]
    (only its low byte is read) with the signs of xf [RS, 8] (never -0.0: ``_code_centre``),
    as ``_store_fields``' 4 + 4 words."""
    u0, u1, u2, u3, u4, u5, u6, u7 = split_columns(v, RS)
    x0, x1, x2, x3, x4, x5, x6, x7 = split_columns(xf.to(tl.int32, bitcast=True), RS)
    return tl.inline_asm_elementwise(
        _PACK44_ASM, _PACK44_CONSTRAINTS,
        [u0, u1, u2, u3, u4, u5, u6, u7, x0, x1, x2, x3, x4, x5, x6, x7],
        dtype=(tl.int32, tl.int32), is_pure=True, pack=1)


@triton.jit
def _store_words(anchor, residual, aw_ptr, rw_ptr, codes_off, res_off, grp, gm,
                 HINT: tl.constexpr):
    """One 32-bit word of 8 anchor / residual nibbles per group ``grp`` (stored where ``gm``)."""
    ap = tl.max_contiguous(aw_ptr + codes_off // 4 + grp, [1])
    tl.store(ap, anchor, mask=gm, eviction_policy=HINT)
    rp = tl.max_contiguous(rw_ptr + res_off // 4 + grp, [1])
    tl.store(rp, residual, mask=gm, eviction_policy=HINT)


@triton.jit
def _store_fields(u, a8_ptr, aw_ptr, r8_ptr, rw_ptr, codes_off, res_off, grp, gm,
                  A_BITS: tl.constexpr, R_BITS: tl.constexpr, BIAS: tl.constexpr,
                  A_WORDS: tl.constexpr, R_WORDS: tl.constexpr, RS: tl.constexpr,
                  HINT: tl.constexpr):
    """u [RS, 8] = anchor field << R_BITS | residual field ^ BIAS -> both packed streams
    (stores with eviction policy HINT)."""
    if (A_BITS == 4) & (R_BITS == 4) & A_WORDS & R_WORDS:
        # 4 + 4: bytes of the even / odd values in two words, then nibbles by word masks
        ue, uo = tl.split(tl.reshape(u, [RS, 4, 2]))
        sh = (tl.arange(0, 4) * 8)[None, :]
        we = tl.sum(ue << sh, axis=1)
        wo = tl.sum(uo << sh, axis=1)
        lo4: tl.constexpr = 0x0F0F0F0F
        anchor = ((we >> 4) & lo4) | (wo & ~lo4)
        residual = ((we & lo4) | ((wo << 4) & ~lo4)) ^ (BIAS * 0x11111111)
        _store_words(anchor, residual, aw_ptr, rw_ptr, codes_off, res_off, grp, gm, HINT)
    else:
        _pack_store(u >> R_BITS, a8_ptr, aw_ptr, codes_off, grp, gm, A_BITS, A_WORDS, RS, HINT)
        _pack_store((u ^ BIAS) & ((1 << R_BITS) - 1), r8_ptr, rw_ptr, res_off, grp, gm, R_BITS,
                    R_WORDS, RS, HINT)


@triton.jit
def _packed_byte(c0, c1, c2, c3, c4, c5, c6, c7, J: tl.constexpr, BITS: tl.constexpr):
    """Byte J of fields c0..c7 packed LSB-first, BITS bits each (offsets known at compile
    time: shifts and ors of the two or three fields the byte holds)."""
    S: tl.constexpr = -8 * J  # where field 0 starts, from the byte's bit 0
    return (moved_bits(c0, S, BITS, 8) | moved_bits(c1, S + BITS, BITS, 8)
            | moved_bits(c2, S + 2 * BITS, BITS, 8) | moved_bits(c3, S + 3 * BITS, BITS, 8)
            | moved_bits(c4, S + 4 * BITS, BITS, 8) | moved_bits(c5, S + 5 * BITS, BITS, 8)
            | moved_bits(c6, S + 6 * BITS, BITS, 8) | moved_bits(c7, S + 7 * BITS, BITS, 8)) & 255


@triton.jit
def _pack_store(f, b8_ptr, w_ptr, off, grp, gmask, BITS: tl.constexpr, WORDS: tl.constexpr,
                RS: tl.constexpr, HINT: tl.constexpr):
    """Store fields f [RS, 8] (row r: 8 consecutive stream values, in one thread) packed
    LSB-first at group index ``grp[r]`` of the stream at byte offset ``off``."""
    if WORDS:  # one word of BITS bytes per group, one store per thread
        w = tl.sum(f << (tl.arange(0, 8) * BITS)[None, :], axis=1)
        ptr = tl.max_contiguous(w_ptr + off // BITS + grp, [1])
        tl.store(ptr, w.to(w_ptr.dtype.element_ty), mask=gmask, eviction_policy=HINT)
    else:  # 8 values -> BITS bytes, each from the fields it holds: BITS byte stores a group
        c0, c1, c2, c3, c4, c5, c6, c7 = split_columns(f, RS)
        base = b8_ptr + off + grp * BITS
        for j in tl.static_range(BITS):
            tl.store(base + j, _packed_byte(c0, c1, c2, c3, c4, c5, c6, c7, j, BITS).to(tl.uint8),
                     mask=gmask, eviction_policy=HINT)


@triton.jit
def _row(s_t, rows_ptr, tok, PAGED: tl.constexpr):
    """Element offset of token ``tok``'s row from ``xh``: tok * s_t, or in a paged cache
    (PAGED > 0) the offset the launcher computed from the slot mapping: the gather fused into
    the load (ops/paged_cache.py ``row_offsets``). PAGED is then a power of two dividing every
    row offset: without that hint a loaded offset hides the rows' alignment and the loads are
    not vectorized (H100: half the bandwidth). tl.load gives the offsets a layout of its own
    (a shared-memory conversion per step); loading them in the rows' layout through inline PTX
    (ld.global.nc) removed it but was slower on the H100 (docs/benchmarks.md, 2026-11-25)."""
    if PAGED:
        r = tl.load(rows_ptr + tok)
        if PAGED > 1:
            r = tl.multiple_of(r, PAGED)
        return r
    else:
        return tok * s_t


@triton.jit
def _block_phase(rows_ptr, body0, tp, s_t, BT: tl.constexpr, BLOCK: tl.constexpr,
                 PAGED: tl.constexpr):
    """(q, ok, base) of a page's row offsets: ok where every break (a token whose row is not
    the previous token's + s_t) is at a page token t with t % BLOCK == q, i.e. the page's
    tokens are runs of consecutive rows (a paged cache's blocks of BLOCK tokens) whose starts
    are known, every row is within 2**30 elements of ``base`` (the first token's) and the
    page is full (tp == BT: no token past the body to clamp): then
    ``_run_rows`` needs two 32-bit offsets per run of at most BLOCK tokens, not a load per
    token. Checked per program on the offsets themselves, so any slot mapping stays exact
    (the launcher's BLOCK is only a guess of the cache's block size)."""
    t = tl.arange(0, BT)
    cur = tl.load(rows_ptr + body0 + tl.minimum(t, tp - 1))
    prev = tl.load(rows_ptr + body0 + tl.maximum(tl.minimum(t, tp - 1) - 1, 0))
    base = tl.load(rows_ptr + body0)
    if PAGED > 1:  # here, on the load: a hint on a value passed on is lost
        base = tl.multiple_of(base, PAGED)
    brk = (t >= 1) & (t < tp) & (cur - prev != s_t)
    first = tl.min(tl.where(brk, t, BT))
    q = first & (BLOCK - 1)
    far = (cur - base >= (1 << 30)) | (cur - base <= -(1 << 30))
    off = tl.max(tl.where((brk & (((t - q) & (BLOCK - 1)) != 0)) | far, 1, 0))
    return q, (off == 0) & (tp == BT) & (s_t < (1 << 30) // BT), base


@triton.jit
def _run_rows(rows_ptr, body0, tr0, tp, s_t, q, base, BLOCK: tl.constexpr,
              UNIT: tl.constexpr):
    """Rows walking page tokens tr0, tr0 + 1, ... of a full page (channel axis: a thread's
    C / CS steps), given ``_block_phase``'s q and base: (ra, rb, kb) for ``_run_row``,
    int32 offsets from ``base`` in UNITs of elements: a run crosses at most one block start,
    kb steps in (its length is at most BLOCK), after which its rows continue from rb."""
    a = tr0  # a full page (``_block_phase``)
    kb = BLOCK - ((a - q) & (BLOCK - 1))
    ra = ((_load_offsets(rows_ptr + body0 + a) - base) // UNIT).to(tl.int32)
    rb = ((_load_offsets(rows_ptr + body0 + tl.minimum(a + kb, tp - 1)) - base) // UNIT
          ).to(tl.int32) - kb * (s_t // UNIT)
    return ra, rb, kb


@triton.jit
def _win_rows(rows_ptr, body0, w, q, base, s_t, TS: tl.constexpr, BLOCK: tl.constexpr,
              UNIT: tl.constexpr):
    """Token axis (a step: page tokens w .. w + TS - 1, TS <= BLOCK): the step's rows from two
    scalar loads (the same for every thread: no layout conversion), given ``_block_phase``'s q
    and base: (e, d0, d1) for ``_win_row``: token w + t is t * s_t + d1 from base where
    t >= e (the run starting inside the step), else t * s_t + d0 (UNITs of elements)."""
    su = s_t // UNIT
    last = w + TS - 1
    s1 = tl.maximum(last - ((last - q) & (BLOCK - 1)), 0)
    s0 = tl.maximum(w - ((w - q) & (BLOCK - 1)), 0)
    r0 = ((tl.load(rows_ptr + body0 + s0) - base) // UNIT).to(tl.int32)
    r1 = ((tl.load(rows_ptr + body0 + s1) - base) // UNIT).to(tl.int32)
    return s1 - w, r0 - (s0 - w) * su, r1 - (s1 - w) * su


@triton.jit
def _win_row(t, e, d0, d1, s_t, PAGED: tl.constexpr, UNIT: tl.constexpr):
    """Offset (UNITs of elements) from ``base`` of token ``t`` of a step, from
    ``_win_rows``' scalars."""
    r = (t * (s_t // UNIT) + tl.where(t >= e, d1, d0)).to(tl.int64)
    if PAGED // UNIT > 1:
        r = tl.multiple_of(r, PAGED // UNIT)
    return r


@triton.jit
def _load_offsets(ptr):
    """int64 offsets at ``ptr``, in the layout of ``ptr`` (the rows'): with tl.load they get a
    layout of their own and every step converts what is computed from them through shared
    memory (2 barriers a step); once per program here, so the inline PTX costs nothing."""
    if INTERPRET:
        return tl.load(ptr)
    else:
        return tl.inline_asm_elementwise("ld.global.nc.b64 $0, [$1];", "=l,l", [ptr],
                                         dtype=tl.int64, is_pure=True, pack=1)


@triton.jit
def _run_row(ra, rb, kb, k, s_t, PAGED: tl.constexpr, UNIT: tl.constexpr):
    """Offset (UNITs of elements) from ``base`` of the k-th token of ``_run_rows``' runs:
    registers only, no load."""
    r = (k * (s_t // UNIT) + tl.where(k >= kb, rb, ra)).to(tl.int64)
    if PAGED // UNIT > 1:
        r = tl.multiple_of(r, PAGED // UNIT)
    return r


@triton.jit
def _preview(v, ptab_ptr, ROW: tl.constexpr, mask):
    """The scalar-preview byte of float16 statistics ``v`` (ROW 0: mu, 1: sigma): a lookup by
    bit pattern in the 64K-entry table made by lynx_stream.preview itself, so every preview
    byte equals the reference's. Only where ``mask`` (the stores'): on the token axis every
    row holds its chunk's statistics, one in GC stores them, and an unmasked lookup per row
    doubled the load instructions of a step."""
    bits = v.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    ptr = ptab_ptr + ROW * 65536 + bits
    if INTERPRET:
        return tl.load(ptr, mask=mask, other=0)
    else:  # in the stores' layout (tl.load's own meant two shared-memory conversions)
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; mov.b32 $0, 0; @p ld.global.nc.u8 $0, [$1]; }",
            "=r,l,r", [ptr, mask.to(tl.int32)], dtype=tl.int32, is_pure=True,
            pack=1).to(tl.uint8)


@triton.jit
def _load_rows(xh, s_t, rows_ptr, body0, tr, tp, xoff, cm, other, EVEN_D: tl.constexpr,
               HINT: tl.constexpr, PAGED: tl.constexpr, ro=0, RO: tl.constexpr = False,
               UNIT: tl.constexpr = 1):
    """The strip's rows of page tokens ``tr`` [R] (channel offsets ``xoff`` [R, 8]). Tokens past
    the page body (tp >= 1) read its last token instead: a copy changes no min / max, and
    what is computed from it is never stored; so only channels past head_dim (not EVEN_D)
    need a mask, and the full strips of real KV load with no mask and no fill registers.
    HINT: the L1 / L2 eviction policy of the load ("" for none). RO: the rows' offsets are
    ``ro`` [R] in UNITs of elements (``_run_row``), not looked up."""
    if RO:
        ptr = xh + (ro * UNIT)[:, None] + xoff
    else:
        ptr = xh + _row(s_t, rows_ptr, body0 + tl.minimum(tr, tp - 1), PAGED)[:, None] + xoff
    if EVEN_D:
        return tl.load(ptr, eviction_policy=HINT)
    else:
        return tl.load(ptr, mask=cm, other=other, eviction_policy=HINT)


@triton.jit
def _load_step(xh, s_t, rows_ptr, body0, tr, tp, xoff, cm, NAN: tl.constexpr,
               EVEN_D: tl.constexpr, WORDS: tl.constexpr, HINT: tl.constexpr,
               PAGED: tl.constexpr, ro=0, RO: tl.constexpr = False):
    """Pass 2's rows as loaded (padding NaN if NAN, else 0): ``_load_rows`` in the KV dtype
    [R, 8], or, if WORDS (bfloat16, channels contiguous, even strides), as int32 words of two
    values [R, 4] (``xoff`` and ``cm`` then in words). ``_widen`` converts a word with one
    shift or mask per value, where the values' own loads cost an extract and a shift (PRMT +
    IMAD) for every odd one."""
    if WORDS:
        tok = body0 + tl.minimum(tr, tp - 1)
        if RO:  # already in words (UNIT 2)
            rw = ro
        elif PAGED:
            rw = tl.load(rows_ptr + tok) >> 1  # even (WORDS): // 2 without a sign fix-up
            if PAGED > 3:
                rw = tl.multiple_of(rw, PAGED // 2)
        else:
            rw = tok * (s_t // 2)
        ptr = xh.to(tl.pointer_type(tl.int32)) + rw[:, None] + xoff
        if EVEN_D:
            return tl.load(ptr, eviction_policy=HINT)
        elif NAN:  # two bfloat16 NaNs
            return tl.load(ptr, mask=cm, other=0x7FC07FC0, eviction_policy=HINT)
        else:
            return tl.load(ptr, mask=cm, other=0, eviction_policy=HINT)
    else:
        return _load_rows(xh, s_t, rows_ptr, body0, tr, tp, xoff, cm,
                          float("nan") if NAN else 0.0, EVEN_D, HINT, PAGED, ro, RO, 1)


@triton.jit
def _step_offsets(gr, s_d, D, WORDS: tl.constexpr):
    """Channel offsets and mask of rows starting at channels ``gr`` [R], for ``_load_step``:
    [R, 8] values, or [R, 4] words if WORDS (channels contiguous)."""
    if WORDS:
        jw = tl.arange(0, 4)
        return gr[:, None] // 2 + jw[None, :], (gr[:, None] + 2 * jw[None, :]) < D
    else:
        j = tl.arange(0, 8)
        return (gr[:, None] + j[None, :]) * s_d, (gr[:, None] + j[None, :]) < D


@triton.jit
def _widen(xk, R: tl.constexpr, WORDS: tl.constexpr):
    """``_load_step``'s rows -> float32 [R, 8] (a bfloat16 is the high half of its float32)."""
    if WORDS:
        lo = (xk << 16).to(tl.float32, bitcast=True)
        hi = (xk & -65536).to(tl.float32, bitcast=True)
        return tl.reshape(tl.join(lo, hi), [R, 8])
    else:
        return xk.to(tl.float32)


@triton.jit
def _stats(lo, hi, csum, count, MIDRANGE: tl.constexpr, BYTE_GRID: tl.constexpr, slev_ptr):
    """(mu f16, sigma f16) of chunks with min / max ``lo`` / ``hi`` of their normalised values
    (``csum``: their tree sum, for the mean). Unused arguments may be anything. BYTE_GRID
    (lynx_tables.py): mu = u / 256, u = min(255, max(0, floor(256 c + 1/2))) of the float32
    centre c, and sigma the smallest level >= max |xn - mu| (``_sigma_on_grid``: the levels at
    ``slev_ptr``)."""
    if MIDRANGE:
        c = (hi + lo) * 0.5  # * 0.5 == / 2 exactly
    else:
        c = tl.math.div_rn(csum, count)
    if BYTE_GRID:  # round half up in lynx_tables.mu_on_grid's float32 operations
        u = tl.minimum(tl.maximum(tl.floor(c * MU_STEPS + 0.5), 0.0), MU_STEPS - 1.0)
        mu32 = u * (1.0 / MU_STEPS)
        need = tl.maximum(hi - mu32, mu32 - lo)  # = max |xn - mu|: RN(. - mu) is monotone
        mu = mu32.to(tl.float16)  # exact, as sigma: u / 256 and every level are float16 values
        sigma = _sigma_on_grid(need, slev_ptr).to(tl.float16)
    else:
        mu = c.to(tl.float16)
        mu32 = mu.to(tl.float32)
        sigma = tl.maximum(hi - mu32, mu32 - lo).to(tl.float16)
    return mu, sigma


@triton.jit
def _level(ptr):
    """float32 table entries at ``ptr`` (an L1-resident 1 KB table), in the layout of ``ptr``
    (tl.load's own layout would convert the chunk statistics through shared memory)."""
    if INTERPRET:
        return tl.load(ptr)
    else:
        return tl.inline_asm_elementwise("ld.global.nc.f32 $0, [$1];", "=f,l", [ptr],
                                         dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _sigma_on_grid(need, slev_ptr):
    """levels[idx], idx = min(255, #{j : levels[j] < need}) (lynx_tables.sigma_index), for
    need >= 0 (NaN or Inf: some level, and no load out of the table). The index of level j >= 1
    in log2 is f(levels[j]) = j + d_j, f(x) = SIGMA_B + log2(x) * SIGMA_PER_LOG2 (= (log2 x + 6)
    * 253 / 5 + 1), |d_j| < 0.036: the levels are 2^(-6 + (j - 1) * 5 / 253) rounded to float16
    (relative error <= 2^-11, < 0.0008 in log2, the spacing being 5 / 253 = 0.0198), save the
    top one (f(0.5 + 2^-8) = 254.57; f(0.5) = 254 exactly). So for idx in 1 .. 254, i.e. need
    in (levels[idx - 1], levels[idx]], f(need) lies in (idx - 1 - 0.036, idx + 0.036] and e =
    round(f(need)) is idx - 1 or idx: lg2.approx's error (~2^-22 relative) and float32's
    rounding of f (< 2^-15) are far inside the margin of 0.46. e clamped to [0, 254] keeps that
    for idx = 1 (e <= 0 -> 0) and gives 254 for idx = 255 (need > 0.5: f > 254 - 0.036), and
    need = 0 (log2 = -inf) has e = 0 = idx. Then idx = e if levels[e] >= need, else e + 1:
    sigma = the least of levels[e], levels[e + 1] (two independent loads) that is >= need.
    tests/gpu/test_triton_kernels.py checks the d_j, and the result at, around and between
    every level."""
    if INTERPRET:  # numpy log2 (the interpreter has no fast_log2f); the result is the same
        lg = tl.log2(need)
    else:  # lg2.approx (one MUFU op)
        lg = libdevice.fast_log2f(need)
    # round(f) in the low mantissa bits (|f| < 2^22); +-Inf or NaN give bits outside the clamp
    w = tl.fma(lg, SIGMA_PER_LOG2, SIGMA_B) + MAGIC
    e = tl.minimum(tl.maximum(w.to(tl.int32, bitcast=True) - MAGIC_BITS, 0), 254)
    lv = _level(slev_ptr + e)  # levels[e + 1] >= need: the min reads it unconditionally (a
    # where would let ptxas predicate its load on the first one's compare: two serial loads)
    return tl.minimum(tl.where(lv >= need, lv, float("inf")), _level(slev_ptr + e + 1))


@triton.jit
def _fold0(x, A: tl.constexpr, B: tl.constexpr, N: tl.constexpr, G: tl.constexpr,
           E: tl.constexpr):
    """[A, B, N, G, E] -> [A // 2, B, N, G, E] with s[i] = x[2i] + x[2i + 1]."""
    return tl.sum(tl.reshape(x, [A // 2, 2, B, N, G, E]), axis=1)


@triton.jit
def _tree0(x, N: tl.constexpr, B: tl.constexpr, NC: tl.constexpr, G: tl.constexpr,
           E: tl.constexpr):
    """Pairwise sum over axis 0 of [N, B, NC, G, E] -> [B, NC, G, E] (N a power of two
    <= 256; each fold runs when the axis still has that size)."""
    if N >= 256:
        x = _fold0(x, 256, B, NC, G, E)
    if N >= 128:
        x = _fold0(x, 128, B, NC, G, E)
    if N >= 64:
        x = _fold0(x, 64, B, NC, G, E)
    if N >= 32:
        x = _fold0(x, 32, B, NC, G, E)
    if N >= 16:
        x = _fold0(x, 16, B, NC, G, E)
    if N >= 8:
        x = _fold0(x, 8, B, NC, G, E)
    if N >= 4:
        x = _fold0(x, 4, B, NC, G, E)
    if N >= 2:
        x = _fold0(x, 2, B, NC, G, E)
    return tl.reshape(x, [B, NC, G, E])


@triton.jit
def _tree_channel(xn, CR: tl.constexpr, CW: tl.constexpr, NC: tl.constexpr, G: tl.constexpr):
    """Pairwise sum over the chunk's tokens c = cw*CR + cr of [CR, CW, NC, G, 8] -> [NC, G, 8]
    (lynx_ref.tree_sum's order: cr pairs first, then cw pairs)."""
    x = _tree0(xn, CR, CW, NC, G, 8)
    return tl.reshape(_tree0(tl.reshape(x, [CW, 1, NC, G, 8]), CW, 1, NC, G, 8), [NC, G, 8])


@triton.jit
def _tree_token(xz, GT: tl.constexpr, TS: tl.constexpr, NCD: tl.constexpr, GL: tl.constexpr):
    """Pairwise sum over the chunk's channels (gt * GL + gl) * 8 + j of [GT, TS, NCD, GL, 8]
    -> [TS, NCD] (lynx_ref.tree_sum's order: j pairs first, then gl, then gt)."""
    x = tl.permute(xz, [4, 0, 1, 2, 3])  # [8, GT, TS, NCD, GL]
    x = _tree0(tl.reshape(x, [8, GT * TS, NCD, GL, 1]), 8, GT * TS, NCD, GL, 1)
    x = tl.permute(tl.reshape(x, [GT * TS, NCD, GL]), [2, 0, 1])  # [GL, GT * TS, NCD]
    x = _tree0(tl.reshape(x, [GL, GT * TS, NCD, 1, 1]), GL, GT * TS, NCD, 1, 1)
    x = _tree0(tl.reshape(x, [GT, TS, NCD, 1, 1]), GT, TS, NCD, 1, 1)
    return tl.reshape(x, [TS, NCD])


@triton.jit
def _recip_or_zero(s):
    """RN(1 / s), 0 where that is not finite (lynx_ref.reciprocal_or_zero; s >= 0)."""
    r = tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)
    return tl.where(r < float("inf"), r, 0.0)


@triton.jit
def _sigma_recip(sigma, recip_ptr, TABLE: tl.constexpr):
    """float16 sigma -> RN(1 / sigma) as float32, 0 where sigma == 0 (xf = +-0, code 0).
    TABLE (for reciprocals computed once per strip): RN(1 / 1.m) from a 1024-entry table
    (ops/tables.py ``recip_table``) with the exponent subtracted (a float16 mantissa has 10
    bits; scaling by 2**-e is exact and the result stays normal), ~5 ops instead of an IEEE
    division; else (once per step: no dependent load) rcp.approx and one Newton step with
    fmas, also RN(1 / sigma) for every float16 (tests/gpu: all of them), where the IEEE
    division adds a range check and a slow-path branch that splits the loop body. The
    interpreter divides."""
    s = sigma.to(tl.float32)
    if TABLE:
        b = s.to(tl.int32, bitcast=True)
        t = tl.load(recip_ptr + ((b >> 13) & 1023)).to(tl.int32, bitcast=True)
        inv = (t - (b & 0x7F800000) + (127 << 23)).to(tl.float32, bitcast=True)
        return tl.where(sigma > 0, inv, 0.0)
    elif INTERPRET:
        return _recip_or_zero(s)
    else:
        r = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [s],
                                      dtype=tl.float32, is_pure=True, pack=1)
        r = tl.fma(r, tl.fma(-s, r, 1.0), r)
        return tl.where(sigma > 0, r, 0.0)


@triton.jit
def _encode_rows(xn, mu, isg, grp, gm, a8_ptr, aw_ptr, r8_ptr, rw_ptr, codes_off, res_off,
                 tab, search_ptr, ALPHA: tl.constexpr, SCALE: tl.constexpr,
                 FLOOR: tl.constexpr, RS: tl.constexpr, A_BITS: tl.constexpr,
                 R_BITS: tl.constexpr, BIAS: tl.constexpr,
                 A_WORDS: tl.constexpr, R_WORDS: tl.constexpr, SMEM: tl.constexpr,
                 HINT: tl.constexpr, PACK_ASM: tl.constexpr, POLY: tl.constexpr,
                 C1: tl.constexpr, C2: tl.constexpr):
    """xn (normalised values, any shape of RS*8), ``_code_centre``'s mu (float32) and
    _sigma_recip's isg, all broadcastable -> packed codes of the RS groups ``grp`` (stored
    where ``gm``), Alg. 1 l.14-18 with the end cells (lynx_ref.quantize):
    u = (m << R_BITS) | (field ^ bias) from the search table (``_codes``): the anchor magnitude
    m is u >> R_BITS (< 2**A_BITS), the residual field (u ^ bias) mod 2**R_BITS. (In a middle
    cell u = I + bias: the field (m << R_BITS) - I = bias - w equals w ^ bias modulo 2**R_BITS,
    w = u mod 2**R_BITS, bias = 2**(R_BITS-1) - 1.) -m - 1 == ~m: a negative value flips the
    A_BITS. PACK_ASM (16-bit KV, so that a thread holds each row): 4 + 4 words by ``_pack44``."""
    xf = tl.reshape((xn - mu) * isg, [RS, 8])
    PRMT: tl.constexpr = (A_BITS == 4) & (R_BITS == 4) & A_WORDS & R_WORDS & PACK_ASM
    u = _codes(xf, tab, search_ptr, ALPHA, SCALE, FLOOR, RS, SMEM, PRMT, POLY, C1, C2)
    if PRMT:
        anchor, residual = _pack44(u, xf, RS)
        _store_words(anchor, residual ^ (BIAS * 0x11111111), aw_ptr, rw_ptr, codes_off,
                     res_off, grp, gm, HINT)
    else:
        u = tl.where(xf < 0, u ^ (((1 << A_BITS) - 1) << R_BITS), u)
        _store_fields(u, a8_ptr, aw_ptr, r8_ptr, rw_ptr, codes_off, res_off, grp, gm, A_BITS,
                      R_BITS, BIAS, A_WORDS, R_WORDS, RS, HINT)


@triton.jit
def _code_centre(mu, isg, lo):
    """The centre the codes subtract: mu (float16) as float32, but the chunk's least value
    ``lo`` where isg == 0 (sigma rounds to 0: every xf is then +0, not -0 for values below
    mu, so the sign of xf is its sign bit; the codes are those of mu, all 0 and positive)."""
    return tl.where(isg > 0, mu.to(tl.float32), lo)


@triton.jit
def _channel_pass2(xh, s_t, rows_ptr, s_d, body0, tp, h, H, D, d0, lo, hi, gmin, y, stats,
                   prev, ptab_ptr, recip_ptr, slev_ptr,
                   codes_off, res_off, a8_ptr, aw_ptr, r8_ptr, rw_ptr, tab, search_ptr,
                   ALPHA: tl.constexpr, SCALE: tl.constexpr, FLOOR: tl.constexpr,
                   BT: tl.constexpr, G: tl.constexpr, C: tl.constexpr, CS: tl.constexpr,
                   A_BITS: tl.constexpr, R_BITS: tl.constexpr, BIAS: tl.constexpr,
                   A_WORDS: tl.constexpr, R_WORDS: tl.constexpr, MIDRANGE: tl.constexpr,
                   BYTE_GRID: tl.constexpr, TREE: tl.constexpr, SMEM: tl.constexpr,
                   EVEN_D: tl.constexpr, WORDS: tl.constexpr, HINT: tl.constexpr,
                   PACK_ASM: tl.constexpr, POLY: tl.constexpr, C1: tl.constexpr,
                   C2: tl.constexpr, PAGED: tl.constexpr, PREVIEW: tl.constexpr,
                   ra, rb, kb, RUNS: tl.constexpr):
    """Channel axis, given the raw chunk min / max lo, hi [NC, G, 8], gmin and y = 1 / scale
    (``_recip_or_zero``) [G, 8]:
    chunk statistics, then the strip again in NIT = C / CS steps of [NC, CS, G, 8] (step k
    holds chunk tokens c = cs * NIT + k), normalised, coded and stored."""
    NC: tl.constexpr = BT // C
    NIT: tl.constexpr = C // CS
    RS: tl.constexpr = CS * NC * G
    UNIT: tl.constexpr = 2 if WORDS else 1
    lo_n = (lo - gmin) * y  # = min / max of xn over the chunk (xn is monotone)
    hi_n = (hi - gmin) * y
    nc = tl.arange(0, NC)
    j = tl.arange(0, 8)
    r = tl.arange(0, RS)  # r = (cs * NC + nc) * G + g (as in pass 1)
    gr = d0 + (r % G) * 8
    tr0 = ((r // G) % NC) * C + (r // (G * NC)) * NIT
    xoff, cm = _step_offsets(gr, s_d, D, WORDS)
    if MIDRANGE:
        mu, sigma = _stats(lo_n, hi_n, lo_n, lo_n, True, BYTE_GRID, slev_ptr)
    else:  # the chunk sums need every normalised value: the whole strip at once
        CW: tl.constexpr = CS
        CR: tl.constexpr = NIT
        R: tl.constexpr = BT * G
        ra = tl.arange(0, R)  # ra = ((k * CS + cs) * NC + nc) * G + g: c = cs * NIT + k
        ta = ((ra // G) % NC) * C + ((ra // (G * NC)) % CS) * NIT + ra // (G * NC * CS)
        ga = d0 + (ra % G) * 8
        ma = (ta < tp)[:, None] & ((ga[:, None] + j[None, :]) < D)
        xa = tl.load(xh + _row(s_t, rows_ptr, body0 + tl.minimum(ta, tp - 1), PAGED)[:, None]
                     + (ga[:, None] + j[None, :]) * s_d,
                     mask=ma, other=0.0, eviction_policy="evict_last" if HINT != "" else "")
        xz = tl.where(tl.reshape(ma, [CR, CW, NC, G, 8]),
                      (tl.reshape(xa, [CR, CW, NC, G, 8]).to(tl.float32) - gmin) * y,
                      0.0)
        if TREE:  # reference order: pairs (2i, 2i+1) of c = cs * NIT + k: k first, then cs
            csum = _tree_channel(xz, CR, CW, NC, G)
        else:
            csum = tl.sum(tl.sum(xz, axis=0), axis=0)
        count = tl.maximum(tl.minimum(tp - nc * C, C), 1).to(tl.float32)[:, None, None]
        mu, sigma = _stats(lo_n, hi_n, csum, count, False, BYTE_GRID, slev_ptr)
    nct = (tp + C - 1) // C
    dg = d0 + tl.arange(0, G)[:, None] * 8 + j[None, :]
    sidx = (h * nct + nc[:, None, None]) * D + dg[None, :, :]
    smask = (nc < nct)[:, None, None] & (dg < D)[None, :, :]
    tl.store(stats + sidx, mu, mask=smask)
    tl.store(stats + H * nct * D + sidx, sigma, mask=smask)
    if PREVIEW:
        tl.store(prev + sidx, _preview(mu, ptab_ptr, 0, smask), mask=smask)
        tl.store(prev + H * nct * D + sidx, _preview(sigma, ptab_ptr, 1, smask), mask=smask)
    isg = _sigma_recip(sigma, recip_ptr, True)
    mu_c = tl.expand_dims(_code_centre(mu, isg, lo_n), 0)
    # each step's rows are loaded a step ahead (the re-read mostly comes from L2: its latency
    # is hidden behind a step of work rather than by other warps, of which there are few)
    # RUNS: a thread's rows walk runs of consecutive rows (``_run_row``: no offset loads)
    xk = _load_step(xh, s_t, rows_ptr, body0, tr0, tp, xoff, cm, False, EVEN_D, WORDS, HINT,
                    PAGED, _run_row(ra, rb, kb, 0, s_t, PAGED, UNIT) if RUNS else 0, RUNS)
    for k in tl.range(NIT, loop_unroll_factor=2):  # no register copies of x_next
        tr = tr0 + k
        kn = tl.minimum(k + 1, NIT - 1)
        x_next = _load_step(xh, s_t, rows_ptr, body0, tr0 + kn, tp, xoff, cm, False, EVEN_D,
                            WORDS, HINT, PAGED,
                            _run_row(ra, rb, kb, kn, s_t, PAGED, UNIT) if RUNS else 0, RUNS)
        xn = (tl.reshape(_widen(xk, RS, WORDS), [CS, NC, G, 8]) - gmin) * y
        _encode_rows(xn, mu_c, tl.expand_dims(isg, 0),
                     (h * tp + tr) * (D // 8) + gr // 8, (tr < tp) & (gr < D), a8_ptr, aw_ptr,
                     r8_ptr, rw_ptr, codes_off, res_off, tab, search_ptr, ALPHA, SCALE, FLOOR,
                     RS, A_BITS, R_BITS, BIAS, A_WORDS, R_WORDS, SMEM, HINT, PACK_ASM, POLY,
                     C1, C2)
        xk = x_next


@triton.jit
def _token_rows(r, d0, TS: tl.constexpr, NCD: tl.constexpr, GT: tl.constexpr,
                GL: tl.constexpr):
    """Token axis: row r = ((gt * TS + t) * NCD + ncd) * GL + gl of a step -> (its token t, its
    first channel), the group gt * GL + gl of chunk ncd (GC = GT * GL groups of 8)."""
    t = (r // (NCD * GL)) % TS
    return t, d0 + (((r // GL) % NCD) * GT * GL + (r // (GL * NCD * TS)) * GL + r % GL) * 8


@triton.jit
def _row_values(v, GT: tl.constexpr, GL: tl.constexpr, RS: tl.constexpr):
    """A chunk statistic [TS, NCD] as the [RS] value of each row of its chunk (``_token_rows``;
    broadcasts and register splits, no data movement)."""
    TS: tl.constexpr = v.shape[0]
    NCD: tl.constexpr = v.shape[1]
    full = tl.broadcast_to(v[None, :, :, None, None], [GT, TS, NCD, GL, 8])
    c0, _, _, _, _, _, _, _ = split_columns(tl.reshape(full, [RS, 8]), RS)
    return c0


@triton.jit
def _token_pass2(xh, s_t, rows_ptr, s_d, body0, tp, h, H, D, d0, gmin, y, stats, prev,
                 ptab_ptr, recip_ptr, slev_ptr, codes_off,
                 res_off, a8_ptr, aw_ptr, r8_ptr, rw_ptr, tab, search_ptr, ALPHA: tl.constexpr,
                 SCALE: tl.constexpr, FLOOR: tl.constexpr, BT: tl.constexpr,
                 G: tl.constexpr, GC: tl.constexpr, TS: tl.constexpr, GT: tl.constexpr,
                 C: tl.constexpr, A_BITS: tl.constexpr, R_BITS: tl.constexpr,
                 BIAS: tl.constexpr, A_WORDS: tl.constexpr, R_WORDS: tl.constexpr,
                 MIDRANGE: tl.constexpr, BYTE_GRID: tl.constexpr, TREE: tl.constexpr,
                 SMEM: tl.constexpr,
                 EVEN_D: tl.constexpr, WORDS: tl.constexpr, HINT: tl.constexpr,
                 PACK_ASM: tl.constexpr, POLY: tl.constexpr, C1: tl.constexpr,
                 C2: tl.constexpr, PAGED: tl.constexpr, PREVIEW: tl.constexpr,
                 base, q, BLOCK: tl.constexpr, RUNS: tl.constexpr):
    """Token axis, given gmin, y = 1 / scale [GT, NCD, GL, 8] (pass 1's layout): the strip again, TS
    tokens at a time as [GT, TS, NCD, GL, 8] (``_token_rows``), normalised; chunk statistics
    per token, codes, stores. Row r lives in thread r % (32 * num_warps) (the launcher's TS
    makes TS * NCD * GL the thread count), so a thread holds GT groups of a chunk and GL
    neighbouring lanes the rest: the chunk's min / max is mostly in registers and its
    statistics are computed by GL lanes, not by GC. RUNS: rows from ``_win_rows``."""
    NCD: tl.constexpr = G // GC
    GL: tl.constexpr = GC // GT
    CE: tl.constexpr = GC * 8
    RS: tl.constexpr = TS * G
    gmin5 = tl.expand_dims(gmin, 1)
    y5 = tl.expand_dims(y, 1)
    j = tl.arange(0, 8)
    t_r, gr = _token_rows(tl.arange(0, RS), d0, TS, NCD, GT, GL)
    xoff, cmx = _step_offsets(gr, s_d, D, WORDS)
    cm = (gr[:, None] + j[None, :]) < D
    c0 = d0 + tl.arange(0, NCD)[None, :] * CE  # first channel of each chunk (the mean's counts)
    ncd = (D + C - 1) // C
    # channels past head_dim are NaN, which minnum / maxnum ignore (a chunk's padding); each
    # step's rows are loaded a step ahead, as on the channel axis
    NIT: tl.constexpr = BT // TS
    UNIT: tl.constexpr = 2 if WORDS else 1
    # RUNS: each step's rows from two scalars (``_win_rows``), loaded a step before the rows
    if RUNS:
        e, d0, d1 = _win_rows(rows_ptr, body0, 0, q, base, s_t, TS, BLOCK, UNIT)
        ro = _win_row(t_r, e, d0, d1, s_t, PAGED, UNIT)
        e, d0, d1 = _win_rows(rows_ptr, body0, tl.minimum(1, NIT - 1) * TS, q, base, s_t, TS,
                              BLOCK, UNIT)
    else:
        ro = 0
    xk = _load_step(xh, s_t, rows_ptr, body0, t_r, tp, xoff, cmx, True, EVEN_D, WORDS, HINT,
                    PAGED, ro, RUNS)
    for k in tl.range(NIT, loop_unroll_factor=2):  # no register copies of x_next
        kn = tl.minimum(k + 1, NIT - 1)
        tr = k * TS + t_r
        tn = kn * TS + t_r
        if RUNS:
            ro = _win_row(t_r, e, d0, d1, s_t, PAGED, UNIT)
        x_next = _load_step(xh, s_t, rows_ptr, body0, tn, tp, xoff, cmx, True, EVEN_D, WORDS,
                            HINT, PAGED, ro, RUNS)
        if RUNS:
            e, d0, d1 = _win_rows(rows_ptr, body0, tl.minimum(k + 2, NIT - 1) * TS, q, base,
                                  s_t, TS, BLOCK, UNIT)
        xn = (tl.reshape(_widen(xk, RS, WORDS), [GT, TS, NCD, GL, 8]) - gmin5) * y5
        lo, hi = tl.reduce((xn, xn), 4, minmax_combine)
        lo, hi = tl.reduce((lo, hi), 3, minmax_combine)
        lo, hi = tl.reduce((lo, hi), 0, minmax_combine)  # [TS, NCD]
        if MIDRANGE:
            mu, sigma = _stats(lo, hi, lo, lo, True, BYTE_GRID, slev_ptr)
        else:
            xz = tl.where(tl.reshape(cm, [GT, TS, NCD, GL, 8]), xn, 0.0)
            if TREE:
                csum = _tree_token(xz, GT, TS, NCD, GL)
            else:
                csum = tl.sum(tl.sum(tl.sum(xz, axis=4), axis=3), axis=0)
            count = tl.maximum(tl.minimum(D - c0, C), 1).to(tl.float32)
            mu, sigma = _stats(lo, hi, csum, count, False, BYTE_GRID, slev_ptr)
        # stored by the first group of each chunk, from the rows' layout (that of the code
        # words): stored as [TS, NCD] they went through shared memory (4 barriers a step)
        valid = (tr < tp) & (gr < D)
        srow = (h * tp + tr) * ncd + gr // C
        smask = valid & (gr % C == 0)
        mu_r = _row_values(mu, GT, GL, RS)
        sigma_r = _row_values(sigma, GT, GL, RS)
        tl.store(stats + srow, mu_r, mask=smask)
        tl.store(stats + H * tp * ncd + srow, sigma_r, mask=smask)
        if PREVIEW:
            tl.store(prev + srow, _preview(mu_r, ptab_ptr, 0, smask), mask=smask)
            tl.store(prev + H * tp * ncd + srow, _preview(sigma_r, ptab_ptr, 1, smask),
                     mask=smask)
        isg = _sigma_recip(sigma, recip_ptr, False)
        mu_c = _code_centre(mu, isg, lo)
        _encode_rows(xn, mu_c[None, :, :, None, None], isg[None, :, :, None, None],
                     (h * tp + tr) * (D // 8) + gr // 8, valid, a8_ptr, aw_ptr, r8_ptr, rw_ptr, codes_off, res_off,
                     tab, search_ptr, ALPHA, SCALE, FLOOR, RS, A_BITS, R_BITS, BIAS, A_WORDS,
                     R_WORDS, SMEM, HINT, PACK_ASM, POLY, C1, C2)
        xk = x_next


@triton.jit
def _strip(x_ptr, xh, s_t, s_d, rows_ptr, ptab_ptr, akv_ptr, a8_ptr, aw_ptr, r8_ptr, rw_ptr,
           search_ptr, recip_ptr, slev_ptr, flags_ptr, gamma, stats, prev, codes_off, res_off,
           flag, h, H, D, d0, body0, tp, q, base,
           WHICH: tl.constexpr, TOKEN_AXIS: tl.constexpr, BT: tl.constexpr, G: tl.constexpr,
           C: tl.constexpr, CS: tl.constexpr, GC: tl.constexpr, TS: tl.constexpr,
           GT: tl.constexpr, A_BITS: tl.constexpr, R_BITS: tl.constexpr, BIAS: tl.constexpr,
           ALPHA: tl.constexpr, SCALE: tl.constexpr, FLOOR: tl.constexpr,
           MIDRANGE: tl.constexpr, BYTE_GRID: tl.constexpr, A_WORDS: tl.constexpr,
           R_WORDS: tl.constexpr, SMEM: tl.constexpr, EVEN_D: tl.constexpr, X_WORDS: tl.constexpr,
           EVICT: tl.constexpr, PACK_ASM: tl.constexpr, POLY: tl.constexpr, C1: tl.constexpr,
           C2: tl.constexpr, TREE: tl.constexpr, PAGED: tl.constexpr, PREVIEW: tl.constexpr,
           BLOCK: tl.constexpr, RUNS: tl.constexpr):
    """The strip's two passes and its gamma / flags (the kernel's body below the page's plan
    row). RUNS: the rows are read as runs of consecutive rows (``_block_phase`` said so for
    this page: ``_run_rows``, ``_win_rows``), else looked up per token (PAGED) or computed
    (dense)."""
    # Pass 1 reads the strip in steps of [RS, 8] (row r: a group of 8 consecutive channels of
    # one token; only the last axis is contiguous, so every Triton version lays it out alike:
    # 8 values per thread, rows across lanes, then warps) and keeps element-wise min / max;
    # pass 2 reads it again (L1 / L2 hits) to code it.
    j = tl.arange(0, 8)
    if not TOKEN_AXIS:
        NC: tl.constexpr = BT // C
        NIT: tl.constexpr = C // CS
        RS: tl.constexpr = CS * NC * G
        # r = (cs * NC + nc) * G + g: chunk token c = cs * NIT + k. Row r lives in thread
        # r % (32 * num_warps), so where NC * G is the thread count (the launcher's choice of
        # BD) a thread holds all CS tokens of its (chunk, group) and walks the chunk: the chunk
        # reduction stays in registers and each chunk's statistics are computed once, not once
        # per lane of a shuffle reduction.
        r = tl.arange(0, RS)
        tr0 = ((r // G) % NC) * C + (r // (G * NC)) * NIT
        gr = d0 + (r % G) * 8
    else:  # the rows of the codes pass (pass 1 then leaves gmin / gmax in its layout)
        NCD: tl.constexpr = G // GC
        GL: tl.constexpr = GC // GT
        RS: tl.constexpr = TS * G
        NIT: tl.constexpr = BT // TS
        tr0, gr = _token_rows(tl.arange(0, RS), d0, TS, NCD, GT, GL)
    UNIT: tl.constexpr = 2 if X_WORDS else 1  # pass 2's loads: words of two values
    if RUNS:  # loaded once, kept for both passes; rows from base
        xh = xh + base
    if RUNS and not TOKEN_AXIS:
        ra, rb, kb = _run_rows(rows_ptr, body0, tr0, tp, s_t, q, base, BLOCK, UNIT)
    else:
        ra = 0
        rb = 0
        kb = 0
    cm = (gr[:, None] + j[None, :]) < D
    xoff = (gr[:, None] + j[None, :]) * s_d
    # The min / max propagate NaN (min.NaN / max.NaN, no extra instruction), so a channel's
    # page min or max is not finite exactly when a value of it is NaN or Inf: the flag below
    # costs one test per channel, not per value. Channels past head_dim load as NaN (no
    # per-value select); their min / max are never flagged, stored or mixed with another
    # channel's. On the GPU min / max stay in the KV dtype (exact; packed pairs for 16-bit
    # floats, no conversion); the interpreter's bfloat16 maximum is wrong (Triton 3.9: -inf),
    # so it takes float32.
    xdt = tl.float32 if INTERPRET else x_ptr.dtype.element_ty
    lo = tl.full([RS, 8], float("inf"), xdt)
    hi = tl.full([RS, 8], float("-inf"), xdt)
    for k in tl.static_range(NIT):
        if not TOKEN_AXIS:
            tr = tr0 + k
            if RUNS:
                ro = _run_row(ra, rb, kb, k, s_t, PAGED, UNIT)
            else:
                ro = 0
        else:
            tr = tr0 + k * TS
            if RUNS:
                e, w0, w1 = _win_rows(rows_ptr, body0, k * TS, q, base, s_t, TS, BLOCK, UNIT)
                ro = _win_row(tr0, e, w0, w1, s_t, PAGED, UNIT)
            else:
                ro = 0
        xk = _load_rows(xh, s_t, rows_ptr, body0, tr, tp, xoff, cm, float("nan"), EVEN_D,
                        "evict_last" if EVICT else "", PAGED, ro, RUNS, UNIT).to(xdt)
        lo = pmin(lo, xk)
        hi = pmax(hi, xk)
    lo = lo.to(tl.float32)
    hi = hi.to(tl.float32)
    if not TOKEN_AXIS:  # chunk min / max [NC, G, 8], then over the chunks
        lo, hi = tl.reduce((tl.reshape(lo, [CS, NC, G, 8]), tl.reshape(hi, [CS, NC, G, 8])), 0,
                           minmax_nan_combine)
        gmin, gmax = tl.reduce((lo, hi), 0, minmax_nan_combine)  # [G, 8]
    else:  # [GT, NCD, GL, 8]
        gmin, gmax = tl.reduce((tl.reshape(lo, [GT, TS, NCD, GL, 8]),
                                tl.reshape(hi, [GT, TS, NCD, GL, 8])), 1, minmax_nan_combine)
    y = _recip_or_zero(gmax - gmin)  # xn = RN(RN(x - gmin) * y), as lynx_ref
    # the search table: in registers (-> shared memory for tl.gather) if SMEM, else global (L1)
    if SMEM:  # (``_codes``: PRMT reads the entries' low words, the thresholds)
        if (A_BITS == 4) & (R_BITS == 4) & A_WORDS & R_WORDS & PACK_ASM:
            tab = tl.load(search_ptr.to(tl.pointer_type(tl.int32))
                          + 2 * tl.arange(0, SEARCH_LEN))
        else:
            tab = tl.load(search_ptr + tl.arange(0, SEARCH_LEN))
    else:
        tab = search_ptr
    if not TOKEN_AXIS:
        _channel_pass2(xh, s_t, rows_ptr, s_d, body0, tp, h, H, D, d0, lo, hi, gmin, y, stats,
                       prev, ptab_ptr, recip_ptr, slev_ptr,
                       codes_off, res_off, a8_ptr, aw_ptr, r8_ptr, rw_ptr, tab, search_ptr, ALPHA,
                       SCALE, FLOOR, BT, G, C, CS, A_BITS, R_BITS, BIAS, A_WORDS, R_WORDS,
                       MIDRANGE, BYTE_GRID, TREE, SMEM, EVEN_D, X_WORDS,
                       "evict_first" if EVICT else "", PACK_ASM, POLY, C1, C2, PAGED, PREVIEW,
                       ra, rb, kb, RUNS)
    else:
        _token_pass2(xh, s_t, rows_ptr, s_d, body0, tp, h, H, D, d0, gmin, y, stats, prev,
                     ptab_ptr, recip_ptr, slev_ptr, codes_off,
                     res_off, a8_ptr, aw_ptr, r8_ptr, rw_ptr, tab, search_ptr, ALPHA, SCALE, FLOOR,
                     BT, G, GC, TS, GT, C, A_BITS, R_BITS, BIAS, A_WORDS, R_WORDS, MIDRANGE,
                     BYTE_GRID, TREE, SMEM, EVEN_D, X_WORDS, "evict_first" if EVICT else "",
                     PACK_ASM, POLY, C1, C2, PAGED, PREVIEW, base, q, BLOCK, RUNS)
    gdt = akv_ptr.dtype.element_ty
    if not TOKEN_AXIS:
        dg = d0 + tl.arange(0, G)[:, None] * 8 + j[None, :]
    else:  # gmin's [GT, NCD, GL, 8]: group ncd * GC + gt * GL + gl
        gt = tl.arange(0, GT)[:, None, None, None]
        nd = tl.arange(0, NCD)[None, :, None, None]
        gl = tl.arange(0, GL)[None, None, :, None]
        dg = d0 + ((nd * GC + gt * GL + gl) * 8 + j[None, None, None, :])
    gmask = dg < tl.minimum(tp, 1) * D  # no gamma for a page without body tokens
    tl.store(gamma + h * D + dg, gmin.to(gdt), mask=gmask)
    tl.store(gamma + H * D + h * D + dg, gmax.to(gdt), mask=gmask)
    # Input no page can carry (lynx_ref.quantize refuses it): a channel with NaN / Inf (its
    # min or max not finite), or whose range overflows float32. One reduction per program.
    fin = (tl.abs(gmin) < float("inf")) & (tl.abs(gmax) < float("inf"))
    bad = tl.sum(tl.where((dg < D) & ~fin, 65536, 0)
                 + tl.where((dg < D) & fin & ~(gmax - gmin < float("inf")), 1, 0))
    tl.atomic_max(flags_ptr + 2 * WHICH, flag, mask=bad >= 65536)
    tl.atomic_max(flags_ptr + 2 * WHICH + 1, flag, mask=(bad & 65535) > 0)



@triton.jit
def lynx_compress_kernel(
        x_ptr, s_h, s_t, s_d,            # K or V [H, T, D] and its strides (elements)
        rows_ptr,                        # PAGED: int64 [T] row offsets (elements) from x_ptr
        prev_ptr,                        # PREVIEW: int64 [num_pages, 2] preview byte offsets
        ptab_ptr,                        # PREVIEW: uint8 [2, 65536] preview of f16 bits
        a8_ptr, akv_ptr, a16_ptr,        # the anchor buffer as uint8 / KV dtype / float16
        aw_ptr,                          # ... as words of A_BITS bytes (A_BITS in 1, 2, 4)
        r8_ptr, rw_ptr,                  # the residual buffer as uint8 / words of R_BITS bytes
        plan_ptr,                        # int64 [num_pages, NF]
        search_ptr,                      # int64 [256]: this stream's LogSearch entries
                                         # (threshold and code bytes; ops/tables.py)
        recip_ptr,                       # float32 [1024]: RN(1 / 1.m) (ops/tables.py)
        slev_ptr,                        # BYTE_GRID: float32 [256] sigma levels (lynx_tables)
        flags_ptr,                       # int32 [2, 2]: bad input found (ops/value_flags.py)
        work_ptr,                        # MODE 1 / 2: int32 [1 + num_pages], zeroed: the
                                         # count, then the pages MODE 1 left to MODE 2
        H, D, NUM_DT, NUM_PH,            # NUM_PH = num_pages * H (the flags' codes)
        WHICH: tl.constexpr, TOKEN_AXIS: tl.constexpr, BT: tl.constexpr, G: tl.constexpr,
        C: tl.constexpr, CS: tl.constexpr, GC: tl.constexpr, TS: tl.constexpr,
        GT: tl.constexpr,
        BS: tl.constexpr, ES: tl.constexpr,
        A_BITS: tl.constexpr, R_BITS: tl.constexpr, BIAS: tl.constexpr,
        ALPHA: tl.constexpr, SCALE: tl.constexpr, FLOOR: tl.constexpr,
        MIDRANGE: tl.constexpr, A_WORDS: tl.constexpr,
        R_WORDS: tl.constexpr, SEC: tl.constexpr, SMEM: tl.constexpr, EVEN_D: tl.constexpr,
        X_WORDS: tl.constexpr, EVICT: tl.constexpr, PACK_ASM: tl.constexpr,
        POLY: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, TREE: tl.constexpr = True,
        PAGED: tl.constexpr = 0, PREVIEW: tl.constexpr = False,
        HEADS_FAST: tl.constexpr = False, BLOCK: tl.constexpr = 0, MODE: tl.constexpr = 0,
        BYTE_GRID: tl.constexpr = False):
    if HEADS_FAST:  # a paged cache: the programs running together read whole token rows
        h = tl.program_id(0)
        pid = tl.program_id(1)
    else:
        pid = tl.program_id(0)
        h = tl.program_id(1)
    dt = pid % NUM_DT  # channel strips vary fastest: neighbours share input rows
    page = pid // NUM_DT
    if MODE == 2:  # the grid of every page; the first count * NUM_DT take MODE 1's list
        if page >= tl.load(work_ptr):
            return
        page = tl.load(work_ptr + 1 + page)
    flag = NUM_PH - (page * H + h)  # > 0; the largest is the first (page, head) flagged
    row = plan_ptr + page * NF
    token0 = tl.load(row + F_TOKEN0).to(tl.int32)  # token counts fit int32; byte offsets stay int64
    body0 = tl.load(row + F_BODY0).to(tl.int32)
    tp = tl.load(row + F_NUM_BODY).to(tl.int32)
    ns = tl.load(row + F_NUM_SINK).to(tl.int32)
    BD: tl.constexpr = G * 8
    d0 = dt * BD
    xh = x_ptr + h * s_h

    if (ns > 0) & (MODE != 2):  # page 0: the exact sink tokens, [H, ns, D] in the KV dtype
        s = tl.arange(0, BS)
        dd = d0 + tl.arange(0, BD)
        sm = (s < ns)[:, None] & (dd < D)[None, :]
        srow_off = _row(s_t, rows_ptr, token0 + tl.minimum(s, ns - 1), PAGED)
        xs = tl.load(xh + srow_off[:, None] + dd[None, :] * s_d, mask=sm)
        sink = akv_ptr + tl.load(row + F_SINK + WHICH) // ES
        tl.store(sink + (h * ns + s)[:, None] * D + dd[None, :], xs, mask=sm)
        # sinks are copied, not coded: flag NaN / Inf here (pass 1 covers the body)
        sink_bad = tl.sum(tl.where(sm & ~(tl.abs(xs.to(tl.float32)) < float("inf")), 1, 0))
        tl.atomic_max(flags_ptr + 2 * WHICH, flag, mask=sink_bad > 0)
    if (WHICH == 0) & (MODE != 2):  # (MODE 2: the first launch wrote them)
        if (h == 0) & (dt == 0):  # alignment padding of this page's sections
            o = tl.arange(0, 32)
            zero = tl.zeros([32], dtype=tl.uint8)
            for i in tl.static_range(NUM_PADS):
                start = tl.load(row + F_PADS + 2 * i)
                length = tl.load(row + F_PADS + 2 * i + 1)
                if i < NUM_PADS - 1:
                    tl.store(a8_ptr + start + o, zero, mask=o < length)
                else:
                    tl.store(r8_ptr + start + o, zero, mask=o < length)

    if tp == 0:  # no body tokens (a page of sinks only): nothing more to write
        return
    gamma = akv_ptr + section(row, F_GAMMA + WHICH, SEC) // ES
    stats = a16_ptr + section(row, F_STATS + WHICH, SEC) // 2
    if PREVIEW:  # the wire's one-byte previews of the stats (ops/wire_layout.py)
        prev = a8_ptr + tl.load(prev_ptr + page * 2 + WHICH)
    else:
        prev = a8_ptr
    codes_off = section(row, F_CODES + WHICH, SEC)
    res_off = section(row, F_RES + WHICH, SEC)
    if MODE == 0:
        _strip(x_ptr, xh, s_t, s_d, rows_ptr, ptab_ptr, akv_ptr, a8_ptr, aw_ptr, r8_ptr, rw_ptr,
               search_ptr, recip_ptr, slev_ptr, flags_ptr, gamma, stats, prev, codes_off,
               res_off, flag, h, H, D, d0, body0, tp, 0, 0, WHICH, TOKEN_AXIS, BT, G, C, CS, GC,
               TS, GT, A_BITS, R_BITS, BIAS, ALPHA, SCALE, FLOOR, MIDRANGE, BYTE_GRID, A_WORDS,
               R_WORDS, SMEM, EVEN_D, X_WORDS, EVICT, PACK_ASM, POLY, C1, C2, TREE, PAGED, PREVIEW,
               BLOCK, False)
    else:
        # a paged cache read in two launches: the pages whose rows are runs of BLOCK
        # consecutive rows (MODE 1, two offsets per run), then the others (MODE 2, an offset
        # per token): per-token code in the first launch's loops, even unexecuted, made them
        # 45% slower (docs/benchmarks.md, 2026-11-26 third session)
        if MODE == 1:
            q, runs, base = _block_phase(rows_ptr, body0, tp, s_t, BT, BLOCK, PAGED)
            if runs:
                _strip(x_ptr, xh, s_t, s_d, rows_ptr, ptab_ptr, akv_ptr, a8_ptr, aw_ptr,
                       r8_ptr, rw_ptr, search_ptr, recip_ptr, slev_ptr, flags_ptr, gamma,
                       stats, prev, codes_off, res_off, flag, h, H, D, d0, body0, tp, q, base,
                       WHICH, TOKEN_AXIS, BT, G, C, CS, GC, TS, GT, A_BITS, R_BITS, BIAS, ALPHA,
                       SCALE, FLOOR, MIDRANGE, BYTE_GRID, A_WORDS, R_WORDS, SMEM, EVEN_D,
                       X_WORDS, EVICT, PACK_ASM, POLY, C1, C2, TREE, PAGED, PREVIEW, BLOCK, True)
            elif (h == 0) & (dt == 0):  # listed once for MODE 2 (no program re-checks it)
                tl.store(work_ptr + 1 + tl.atomic_add(work_ptr, 1), page)
        else:
            _strip(x_ptr, xh, s_t, s_d, rows_ptr, ptab_ptr, akv_ptr, a8_ptr, aw_ptr,
                   r8_ptr, rw_ptr, search_ptr, recip_ptr, slev_ptr, flags_ptr, gamma, stats,
                   prev, codes_off, res_off, flag, h, H, D, d0, body0, tp, 0, 0, WHICH,
                   TOKEN_AXIS, BT, G, C, CS, GC, TS, GT, A_BITS, R_BITS, BIAS, ALPHA,
                   SCALE, FLOOR, MIDRANGE, BYTE_GRID, A_WORDS, R_WORDS, SMEM, EVEN_D,
                   X_WORDS, EVICT, PACK_ASM, POLY, C1, C2, TREE, PAGED, PREVIEW, BLOCK, False)
