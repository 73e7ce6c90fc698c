"""Triton helpers shared by the Lynx kernels: section offsets, packed-code loads and the min /
max combine.

Every helper reproduces a step of lynx_npu/codec/lynx_ref.py exactly (float32; launchers pass
``enable_fp_fusion=False``, so only the explicit ``tl.fma`` calls fuse). Packing follows
lynx_npu/codec/packing.py (LSB-first bit stream). Written for Triton 3.6 (the GPU machines)
and 3.9 (PyPI, TRITON_INTERPRET=1).
"""
import triton
import triton.language as tl


@triton.jit
def section(row, field, ALIGN: tl.constexpr):
    """Byte offset of a section from its plan row (int64), a multiple of ALIGN (the plan's
    section_align: a hint that lets loads and stores of the section vectorize)."""
    off = tl.load(row + field)
    if ALIGN > 1:
        off = tl.multiple_of(off, ALIGN)
    return off


@triton.jit
def moved_bits(x, S: tl.constexpr, XW: tl.constexpr, DW: tl.constexpr):
    """x (XW bits wide) shifted by S bits (left; right where S < 0) into a DW-bit destination,
    or 0 where none of its bits land there: a packed field's part of a byte, or a byte's part
    of a field, at offsets known at compile time."""
    KEEP: tl.constexpr = (S < DW) & (S + XW > 0)
    r = x * 0
    if KEEP:
        if S >= 0:
            r = x << S
        else:
            r = x >> (-S)
    return r


@triton.jit
def split_columns(x, RS: tl.constexpr):
    """The 8 columns of x [RS, 8] as 8 tensors [RS] (free where a thread holds a row; the
    inverse of join_columns)."""
    e, o = tl.split(tl.reshape(x, [RS, 4, 2]))      # columns 0 2 4 6 / 1 3 5 7
    e04, e26 = tl.split(tl.reshape(e, [RS, 2, 2]))  # 0 4 / 2 6
    o15, o37 = tl.split(tl.reshape(o, [RS, 2, 2]))  # 1 5 / 3 7
    c0, c4 = tl.split(e04)
    c2, c6 = tl.split(e26)
    c1, c5 = tl.split(o15)
    c3, c7 = tl.split(o37)
    return c0, c1, c2, c3, c4, c5, c6, c7


@triton.jit
def join_columns(c0, c1, c2, c3, c4, c5, c6, c7):
    """[Q, 8] of eight [Q] columns (the inverse of split_columns)."""
    Q: tl.constexpr = c0.shape[0]
    e = tl.reshape(tl.join(tl.join(c0, c4), tl.join(c2, c6)), [Q, 4])  # columns 0 2 4 6
    o = tl.reshape(tl.join(tl.join(c1, c5), tl.join(c3, c7)), [Q, 4])  # columns 1 3 5 7
    return tl.reshape(tl.join(e, o), [Q, 8])


@triton.jit
def _field(b0, b1, b2, b3, b4, b5, b6, b7, I: tl.constexpr, BITS: tl.constexpr):
    """Field I (BITS wide) of an 8-field LSB-first packing, from its bytes b0..b7."""
    S: tl.constexpr = -BITS * I  # where byte 0 starts, from the field's bit 0
    MASK: tl.constexpr = (1 << BITS) - 1
    return (moved_bits(b0, S, 8, BITS) | moved_bits(b1, S + 8, 8, BITS)
            | moved_bits(b2, S + 16, 8, BITS) | moved_bits(b3, S + 24, 8, BITS)
            | moved_bits(b4, S + 32, 8, BITS) | moved_bits(b5, S + 40, 8, BITS)
            | moved_bits(b6, S + 48, 8, BITS) | moved_bits(b7, S + 56, 8, BITS)) & MASK


@triton.jit
def unpack_fields(b8_ptr, w_ptr, off, grp, qmask, Q: tl.constexpr, BITS: tl.constexpr,
                  WORDS: tl.constexpr):
    """Unsigned BITS-bit fields [Q, 8]: row q is group ``grp[q]`` (8 consecutive values) of a
    packed stream at byte offset ``off``; masked groups read as 0. WORDS (BITS in 1, 2, 4):
    ``w_ptr`` views the stream as words of BITS bytes, one load per group (not vectorized
    across groups: a thread holds one group per row); else the group's BITS bytes are loaded
    one by one and each field put together from the bytes it spans, at offsets known at
    compile time (no 64-bit word, no byte masks)."""
    MASK: tl.constexpr = (1 << BITS) - 1
    if WORDS:
        ptr = tl.max_contiguous(w_ptr + off // BITS + grp, [1])
        w = tl.load(ptr, mask=qmask, other=0).to(tl.int32)
        return (w[:, None] >> (tl.arange(0, 8) * BITS)[None, :]) & MASK
    else:
        # one [Q, 8] tile of the groups' bytes (BITS..7 masked): contiguous columns, so that
        # Triton loads runs of bytes across a warp and re-lays them so a thread holds its rows
        j = tl.arange(0, 8)[None, :]
        b = tl.load(b8_ptr + off + grp[:, None] * BITS + j, mask=qmask[:, None] & (j < BITS),
                    other=0).to(tl.int32)
        b0, b1, b2, b3, b4, b5, b6, b7 = split_columns(b, Q)
        return join_columns(_field(b0, b1, b2, b3, b4, b5, b6, b7, 0, BITS),
                            _field(b0, b1, b2, b3, b4, b5, b6, b7, 1, BITS),
                            _field(b0, b1, b2, b3, b4, b5, b6, b7, 2, BITS),
                            _field(b0, b1, b2, b3, b4, b5, b6, b7, 3, BITS),
                            _field(b0, b1, b2, b3, b4, b5, b6, b7, 4, BITS),
                            _field(b0, b1, b2, b3, b4, b5, b6, b7, 5, BITS),
                            _field(b0, b1, b2, b3, b4, b5, b6, b7, 6, BITS),
                            _field(b0, b1, b2, b3, b4, b5, b6, b7, 7, BITS))


@triton.jit
def minmax_combine(a_lo, a_hi, b_lo, b_hi):
    """Element-wise min / max ignoring NaN (minnum: padding loaded as NaN drops out)."""
    return tl.minimum(a_lo, b_lo), tl.maximum(a_hi, b_hi)


@triton.jit
def minmax_nan_combine(a_lo, a_hi, b_lo, b_hi):
    """``minmax_combine`` that propagates NaN (PTX min.NaN / max.NaN): compress's pass 1, whose
    page min / max also flag non-finite input (a NaN must survive every reduction)."""
    return (tl.minimum(a_lo, b_lo, propagate_nan=tl.PropagateNan.ALL),
            tl.maximum(a_hi, b_hi, propagate_nan=tl.PropagateNan.ALL))


@triton.jit
def pmin(a, b):
    """tl.minimum propagating NaN (min.NaN: a NaN operand makes the result NaN, so a page's
    min flags a NaN in it); 16-bit floats as packed pairs of consecutive values
    (min.NaN.{bf16x2,f16x2}: LLVM otherwise re-pairs halves with PRMT)."""
    if a.dtype == tl.bfloat16:
        return tl.inline_asm_elementwise("min.NaN.bf16x2 $0, $1, $2;", "=r,r,r", [a, b],
                                         dtype=tl.bfloat16, is_pure=True, pack=2)
    elif a.dtype == tl.float16:
        return tl.inline_asm_elementwise("min.NaN.f16x2 $0, $1, $2;", "=r,r,r", [a, b],
                                         dtype=tl.float16, is_pure=True, pack=2)
    else:
        return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def pmax(a, b):
    """tl.maximum as pmin (max.NaN)."""
    if a.dtype == tl.bfloat16:
        return tl.inline_asm_elementwise("max.NaN.bf16x2 $0, $1, $2;", "=r,r,r", [a, b],
                                         dtype=tl.bfloat16, is_pure=True, pack=2)
    elif a.dtype == tl.float16:
        return tl.inline_asm_elementwise("max.NaN.f16x2 $0, $1, $2;", "=r,r,r", [a, b],
                                         dtype=tl.float16, is_pure=True, pack=2)
    else:
        return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
