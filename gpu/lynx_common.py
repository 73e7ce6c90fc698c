"""Triton helpers shared by the Lynx kernels: pairwise chunk sums, code lookup, bit packing.

Every helper reproduces a step of lynx_npu/codec/lynx_ref.py exactly (float32, IEEE division
via ``tl.math.div_rn``, no FMA: launchers pass ``enable_fp_fusion=False``):

* ``tree_sum_mid`` / ``tree_sum_last``: the chunk sum in the reference's fixed order
  (lynx_ref.tree_sum: zero-pad to a power of two, add adjacent pairs s[i] = x[2i] + x[2i+1]):
  each level is a sum over an axis of size 2, a single commutative add, so the result does not
  depend on how Triton lays the tile out.
* ``codes``: I = #{thresholds <= |x|} by the bucket index of lynx_npu/ops/tables.py.
* ``pack_store`` / ``unpack_load``: the LSB-first bit stream of lynx_npu/codec/packing.py.

They are written for Triton 3.6 (the GPU machines) and 3.9 (PyPI, TRITON_INTERPRET=1).
"""
import triton
import triton.language as tl

ONE_BITS = tl.constexpr(0x3F800000)  # float32 bits of 1.0


@triton.jit
def _fold_mid(x, A: tl.constexpr, N: tl.constexpr, B: tl.constexpr):
    """[A, N, B] -> [A, N // 2, B] with s[i] = x[2i] + x[2i + 1]."""
    return tl.sum(tl.reshape(x, [A, N // 2, 2, B]), axis=2)


@triton.jit
def tree_sum_mid(x, A: tl.constexpr, N: tl.constexpr, B: tl.constexpr):
    """Pairwise sum over the middle axis of [A, N, B] (N a power of two <= 256) -> [A, B]."""
    if N >= 256:
        x = _fold_mid(x, A, 256, B)
    if N >= 128:
        x = _fold_mid(x, A, 128, B)
    if N >= 64:
        x = _fold_mid(x, A, 64, B)
    if N >= 32:
        x = _fold_mid(x, A, 32, B)
    if N >= 16:
        x = _fold_mid(x, A, 16, B)
    if N >= 8:
        x = _fold_mid(x, A, 8, B)
    if N >= 4:
        x = _fold_mid(x, A, 4, B)
    if N >= 2:
        x = _fold_mid(x, A, 2, B)
    return tl.reshape(x, [A, B])


@triton.jit
def tree_sum_last(x, A: tl.constexpr, B: tl.constexpr, N: tl.constexpr):
    """Pairwise sum over the last axis of [A, B, N] -> [A, B] (same order as tree_sum_mid)."""
    return tl.reshape(tree_sum_mid(tl.reshape(x, [A * B, N, 1]), A * B, N, 1), [A, B])


@triton.jit
def codes(xf, thr_ptr, bucket_ptr, shift, key_lo, PROBES: tl.constexpr):
    """Magnitude codes I of xf (int32, same shape), exactly searchsorted(thr, |xf|, right)."""
    av = tl.abs(xf)
    bits = tl.minimum(av.to(tl.int32, bitcast=True), ONE_BITS)
    key = tl.maximum((bits >> shift) - key_lo, 0)
    i = tl.load(bucket_ptr + key).to(tl.int32)
    for _ in tl.static_range(PROBES):
        i += (tl.load(thr_ptr + i) <= av).to(tl.int32)
    return i


@triton.jit
def pack_store(vals, out_ptr, row_byte, mask_rows, ncols, R: tl.constexpr, BD: tl.constexpr,
               BITS: tl.constexpr):
    """Store the low BITS of vals [R, BD] (rows of consecutive stream values) packed LSB-first.

    ``row_byte`` [R]: byte offset of each row's first value; only the first ``ncols`` values of
    each row are stored. Callers keep each row's stream position and ``ncols`` multiples of 8,
    so rows start on byte boundaries and no byte is shared between programs.
    """
    v = vals & ((1 << BITS) - 1)
    if 8 % BITS == 0:
        PER: tl.constexpr = 8 // BITS
        sh = tl.arange(0, PER) * BITS
        byte = tl.sum(tl.reshape(v, [R, BD // PER, PER]) << sh[None, None, :], axis=2)
        j = tl.arange(0, BD // PER)
        tl.store(out_ptr + row_byte[:, None] + j[None, :], byte.to(tl.uint8),
                 mask=mask_rows[:, None] & (j * PER < ncols)[None, :])
    else:  # 8 values -> BITS bytes through a 64-bit word
        sh = tl.arange(0, 8).to(tl.int64) * BITS
        word = tl.sum(tl.reshape(v.to(tl.int64), [R, BD // 8, 8]) << sh[None, None, :], axis=2)
        b = tl.arange(0, 8)
        byte = (word[:, :, None] >> (b.to(tl.int64) * 8)[None, None, :]) & 255
        g = tl.arange(0, BD // 8)
        off = row_byte[:, None, None] + (g * BITS)[None, :, None] + b[None, None, :]
        tl.store(out_ptr + off, byte.to(tl.uint8),
                 mask=mask_rows[:, None, None] & (g * 8 < ncols)[None, :, None]
                 & (b < BITS)[None, None, :])


@triton.jit
def unpack_rows(ptr, row_byte, mask_rows, ncols, R: tl.constexpr, BD: tl.constexpr,
                BITS: tl.constexpr):
    """Signed BITS-bit codes [R, BD]: row r holds BD consecutive stream values from byte
    ``row_byte[r]`` (byte aligned); values past ``ncols`` read as 0. Each byte is loaded once:
    bytes, then bit fields (8 values per BITS bytes when BITS does not divide 8)."""
    if 8 % BITS == 0:
        PER: tl.constexpr = 8 // BITS
        j = tl.arange(0, BD // PER)
        b = tl.load(ptr + row_byte[:, None] + j[None, :],
                    mask=mask_rows[:, None] & (j * PER < ncols)[None, :], other=0).to(tl.int32)
        sh = tl.arange(0, PER) * BITS
        v = tl.reshape((b[:, :, None] >> sh[None, None, :]) & ((1 << BITS) - 1), [R, BD])
    else:
        g = tl.arange(0, BD // 8)
        j = tl.arange(0, 8)
        off = row_byte[:, None, None] + (g * BITS)[None, :, None] + j[None, None, :]
        m = mask_rows[:, None, None] & (g * 8 < ncols)[None, :, None] & (j < BITS)[None, None, :]
        b = tl.load(ptr + off, mask=m, other=0).to(tl.int64)
        word = tl.sum(b << (j.to(tl.int64) * 8)[None, None, :], axis=2)
        sh = tl.arange(0, 8).to(tl.int64) * BITS
        v = tl.reshape(((word[:, :, None] >> sh[None, None, :]) & ((1 << BITS) - 1)).to(tl.int32),
                       [R, BD])
    half: tl.constexpr = 1 << (BITS - 1)
    return (v ^ half) - half


@triton.jit
def unpack_groups(ptr, row_byte, mask_rows, ncols, R: tl.constexpr, G: tl.constexpr,
                  BITS: tl.constexpr):
    """Signed BITS-bit codes [R, G, 8]: row r holds 8*G consecutive stream values from byte
    ``row_byte[r]``; values past ``ncols`` read as 0. Each group of 8 values is BITS bytes,
    loaded together and split in registers (the last axis stays inside one thread)."""
    NB: tl.constexpr = 4 if BITS <= 4 else 8   # bytes loaded per group (BITS used)
    g = tl.arange(0, G)
    j = tl.arange(0, NB)
    m = mask_rows[:, None, None] & (g * 8 < ncols)[None, :, None] & (j < BITS)[None, None, :]
    b = tl.load(ptr + row_byte[:, None, None] + (g * BITS)[None, :, None] + j[None, None, :],
                mask=m, other=0)
    if BITS <= 4:
        word = tl.sum(b.to(tl.int32) << (j * 8)[None, None, :], axis=2)
        sh = tl.arange(0, 8) * BITS
        v = (word[:, :, None] >> sh[None, None, :]) & ((1 << BITS) - 1)
    else:
        word = tl.sum(b.to(tl.int64) << (j.to(tl.int64) * 8)[None, None, :], axis=2)
        sh = tl.arange(0, 8).to(tl.int64) * BITS
        v = ((word[:, :, None] >> sh[None, None, :]) & ((1 << BITS) - 1)).to(tl.int32)
    half: tl.constexpr = 1 << (BITS - 1)
    return (v ^ half) - half


@triton.jit
def unpack_words(wptr, row_word, mask_rows, ncols, R: tl.constexpr, G: tl.constexpr,
                 BITS: tl.constexpr):
    """Signed codes [R, G, 8] for BITS in (1, 2, 4): ``wptr`` views the stream as words of BITS
    bytes (int8 / int16 / int32), one word per group of 8 values; row r's groups start at word
    ``row_word[r]``. One load per group; the 8 values are shifted out in registers."""
    g = tl.arange(0, G)
    w = tl.load(wptr + row_word[:, None] + g[None, :],
                mask=mask_rows[:, None] & (g * 8 < ncols)[None, :], other=0).to(tl.int32)
    sh = tl.arange(0, 8) * BITS
    v = (w[:, :, None] >> sh[None, None, :]) & ((1 << BITS) - 1)
    half: tl.constexpr = 1 << (BITS - 1)
    return (v ^ half) - half


@triton.jit
def section(row, field, ALIGN: tl.constexpr):
    """Byte offset of a section from its plan row (int64), a multiple of ALIGN (the plan's
    section_align: a hint that lets loads and stores of the section vectorize)."""
    off = tl.load(row + field)
    if ALIGN > 1:
        off = tl.multiple_of(off, ALIGN)
    return off


@triton.jit
def unpack_fields(b8_ptr, w_ptr, off, grp, qmask, Q: tl.constexpr, BITS: tl.constexpr,
                  WORDS: tl.constexpr):
    """Unsigned BITS-bit fields [Q, 8]: row q is group ``grp[q]`` (8 consecutive values) of a
    packed stream at byte offset ``off``; masked groups read as 0. WORDS (BITS in 1, 2, 4):
    ``w_ptr`` views the stream as words of BITS bytes, one load per group (not vectorized
    across groups: a thread holds one group per row); else the group's BITS bytes are loaded
    together and split in registers."""
    MASK: tl.constexpr = (1 << BITS) - 1
    if WORDS:
        ptr = tl.max_contiguous(w_ptr + off // BITS + grp, [1])
        w = tl.load(ptr, mask=qmask, other=0).to(tl.int32)
        return (w[:, None] >> (tl.arange(0, 8) * BITS)[None, :]) & MASK
    else:
        NB: tl.constexpr = 4 if BITS <= 4 else 8   # bytes loaded per group (BITS used)
        j = tl.arange(0, NB)
        b = tl.load(b8_ptr + off + grp[:, None] * BITS + j[None, :],
                    mask=qmask[:, None] & (j < BITS)[None, :], other=0)
        if BITS <= 4:
            word = tl.sum(b.to(tl.int32) << (j * 8)[None, :], axis=1)
            return (word[:, None] >> (tl.arange(0, 8) * BITS)[None, :]) & MASK
        else:
            word = tl.sum(b.to(tl.int64) << (j.to(tl.int64) * 8)[None, :], axis=1)
            sh = tl.arange(0, 8).to(tl.int64) * BITS
            return ((word[:, None] >> sh[None, :]) & MASK).to(tl.int32)


@triton.jit
def pack_words(vals, wptr, row_word, mask_rows, ncols, R: tl.constexpr, G: tl.constexpr,
               BITS: tl.constexpr):
    """Inverse of unpack_words: vals [R, G, 8] -> one word of BITS bytes per group of 8."""
    sh = tl.arange(0, 8) * BITS
    w = tl.sum((vals & ((1 << BITS) - 1)) << sh[None, None, :], axis=2)
    g = tl.arange(0, G)
    tl.store(wptr + row_word[:, None] + g[None, :], w.to(wptr.dtype.element_ty),
             mask=mask_rows[:, None] & (g * 8 < ncols)[None, :])


@triton.jit
def div_known(x, b, y):
    """x / b rounded to nearest, given y = RN(1 / b): q = x*y, r = x - q*b (exact with an FMA),
    q + r*y (Markstein). Equal to IEEE division whenever r does not underflow: x == 0 or
    |x| >= 2**-102, with a normal quotient (callers guard the rest)."""
    q = x * y
    r = tl.fma(-q, b, x)
    return tl.fma(r, y, q)


@triton.jit
def minmax(x, mask, axis: tl.constexpr):
    """(min, max) of x over ``axis`` where mask, in one reduction."""
    return tl.reduce((tl.where(mask, x, float("inf")), tl.where(mask, x, float("-inf"))), axis,
                     minmax_combine)


@triton.jit
def minmax_combine(a_lo, a_hi, b_lo, b_hi):
    return tl.minimum(a_lo, b_lo), tl.maximum(a_hi, b_hi)


@triton.jit
def minmax_tiny(x, mask, axis: tl.constexpr):
    """(min, max, smallest nonzero |x|) of x over ``axis`` where mask, in one reduction."""
    ax = tl.abs(x)
    return tl.reduce((tl.where(mask, x, float("inf")), tl.where(mask, x, float("-inf")),
                      tl.where(mask & (ax > 0), ax, float("inf"))), axis, _minmax_tiny_combine)


@triton.jit
def _minmax_tiny_combine(a_lo, a_hi, a_t, b_lo, b_hi, b_t):
    return tl.minimum(a_lo, b_lo), tl.maximum(a_hi, b_hi), tl.minimum(a_t, b_t)


@triton.jit
def unpack_load(in_ptr, elem, mask, BITS: tl.constexpr):
    """Signed BITS-bit values at stream positions ``elem`` (any shape) -> int32."""
    pos = elem * BITS
    byte_at = pos >> 3
    sh = (pos & 7).to(tl.int32)
    w = tl.load(in_ptr + byte_at, mask=mask, other=0).to(tl.int32)
    if 8 % BITS != 0:  # a value may straddle two bytes
        hi = tl.load(in_ptr + byte_at + 1, mask=mask & (sh + BITS > 8), other=0).to(tl.int32)
        w = w | (hi << 8)
    v = (w >> sh) & ((1 << BITS) - 1)
    half: tl.constexpr = 1 << (BITS - 1)
    return (v ^ half) - half
