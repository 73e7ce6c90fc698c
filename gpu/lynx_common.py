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
