"""Triton: Lynx decompress (anchor-only or full), fused, into a dense [H, T, D] pair or straight
into a paged KV cache (lynx_npu/codec/lynx_ref.py ``dequantize`` + the v1 page layout).

One program = TB tokens of one page x one kv head x one tile of BD channels, for K or V (WHICH)
(decoding needs no page-wide reduction, so tiles stay small and follow the chunks). It reads its
codes (and residuals; each packed byte once), chunk statistics and gamma once and writes each
output value once, to
``out + offset + block*s_block + offset_in_block*s_token + head*s_head + dim*s_dim`` with
``(block, offset_in_block) = divmod(slot, block_size)``; slot = token for a dense output,
``slot_mapping[token]`` for a paged cache (negative slots are skipped). See ops/dest.py.
"""
import triton
import triton.language as tl

from lynx_npu.ops import plan as P

from .lynx_common import unpack_groups, unpack_words

F_TOKEN0 = tl.constexpr(P.F_TOKEN0)
F_BODY0 = tl.constexpr(P.F_BODY0)
F_NUM_BODY = tl.constexpr(P.F_NUM_BODY)
F_NUM_SINK = tl.constexpr(P.F_NUM_SINK)
F_CODES = tl.constexpr(P.F_CODES)
F_GAMMA = tl.constexpr(P.F_GAMMA)
F_STATS = tl.constexpr(P.F_STATS)
F_SINK = tl.constexpr(P.F_SINK)
F_RES = tl.constexpr(P.F_RES)
NF = tl.constexpr(P.NUM_FIELDS)


@triton.jit
def _row_address(tok, valid, slots_ptr, block_size, s_block, s_tok, PAGED: tl.constexpr):
    """Element offset of each token's row (any shape) and whether it is written."""
    if PAGED:
        slot = tl.load(slots_ptr + tok, mask=valid, other=-1)
    else:
        slot = tok.to(tl.int64)
    return (slot // block_size) * s_block + (slot % block_size) * s_tok, valid & (slot >= 0)


@triton.jit
def _to_out(x, odt: tl.constexpr, INTERPRET: tl.constexpr):
    """float32 -> the output dtype, rounding to nearest even like torch's .to(dtype).

    Triton's interpreter truncates float32 -> bfloat16, so under TRITON_INTERPRET=1 the
    rounding is done on the bits (finite values); on a GPU the native conversion rounds (RTNE).
    """
    if INTERPRET and odt == tl.bfloat16:
        u = x.to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return u.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(odt)


@triton.jit
def lynx_decompress_kernel(
        a8_ptr, akv_ptr, a16_ptr,        # the anchor buffer as uint8 / KV dtype / float16
        aw_ptr,                          # ... as words of A_BITS bytes (A_BITS in 1, 2, 4)
        r8_ptr, rw_ptr,                  # the residual buffer as uint8 / words of R_BITS bytes
        plan_ptr,                        # int64 [num_pages, NF]
        lv_ptr,                          # float32 [128] levels of this stream
        out_ptr, o_off, s_block, s_tok, s_head, s_dim, block_size, slots_ptr,
        H, D, NUM_DT,
        WHICH: tl.constexpr, TOKEN_AXIS: tl.constexpr, NTB: tl.constexpr, TB: tl.constexpr,
        BD: tl.constexpr, C: tl.constexpr, BS: tl.constexpr, ES: tl.constexpr,
        A_BITS: tl.constexpr, R_BITS: tl.constexpr, YMAX: tl.constexpr,
        HAS_RES: tl.constexpr, PAGED: tl.constexpr, INTERPRET: tl.constexpr,
        ALIGN: tl.constexpr, A_WORDS: tl.constexpr, R_WORDS: tl.constexpr):
    # Tiles follow the chunks: channel axis: TB == C tokens (one chunk row) x BD channels, so
    # mu / sigma are a [BD] row; token axis: BD == one chunk of head_dim, so they are a [TB] column.
    dt = tl.program_id(0) % NUM_DT  # channel tiles vary fastest: neighbours share rows
    pb = tl.program_id(0) // NUM_DT
    page = pb // NTB
    tb = pb % NTB
    h = tl.program_id(1)
    row = plan_ptr + page * NF
    token0 = tl.load(row + F_TOKEN0).to(tl.int32)  # token counts fit int32; byte offsets stay int64
    body0 = tl.load(row + F_BODY0).to(tl.int32)
    tp = tl.load(row + F_NUM_BODY).to(tl.int32)
    ns = tl.load(row + F_NUM_SINK).to(tl.int32)
    d0 = dt * BD
    dd = d0 + tl.arange(0, BD)
    dmask = dd < D
    out = out_ptr + o_off + h * s_head
    odt = out_ptr.dtype.element_ty

    if (ns > 0) & (tb == 0):  # page 0: the exact sink tokens
        s = tl.arange(0, BS)
        sm = (s < ns)[:, None] & dmask[None, :]
        sink = akv_ptr + tl.load(row + F_SINK + WHICH) // ES
        vals = tl.load(sink + (h * ns + s)[:, None] * D + dd[None, :], mask=sm)
        at, ok = _row_address(token0 + s, s < ns, slots_ptr, block_size, s_block, s_tok, PAGED)
        tl.store(out + at[:, None] + dd[None, :] * s_dim, vals.to(odt), mask=sm & ok[:, None])

    # The tile is [TB rows, G groups, 8 values]: a group of 8 values is A_BITS (R_BITS) bytes
    # of codes and 16 output bytes (bf16), all inside one thread.
    G: tl.constexpr = BD // 8
    t = tb * TB + tl.arange(0, TB)  # tokens of the page body
    tmask = t < tp
    d3 = (d0 + tl.arange(0, G)[:, None] * 8 + tl.arange(0, 8)[None, :])[None, :, :]  # [1, G, 8]
    m3 = tmask[:, None, None] & (d3 < D)
    e0 = (h * tp + t) * D + d0      # stream position of each row's first value (multiple of 8)
    if A_WORDS:  # a group of 8 codes is one word of A_BITS bytes
        a = unpack_words(aw_ptr + tl.load(row + F_CODES + WHICH) // A_BITS, e0 // 8, tmask,
                         D - d0, TB, G, A_BITS)
    else:
        a = unpack_groups(a8_ptr + tl.load(row + F_CODES + WHICH), (e0 * A_BITS) >> 3, tmask,
                          D - d0, TB, G, A_BITS)
    neg = a < 0
    code = (a ^ (a >> 31)) << R_BITS  # -a - 1 == ~a for negative anchors
    if HAS_RES:
        if R_WORDS:
            code -= unpack_words(rw_ptr + tl.load(row + F_RES + WHICH) // R_BITS, e0 // 8, tmask,
                                 D - d0, TB, G, R_BITS)
        else:
            code -= unpack_groups(r8_ptr + tl.load(row + F_RES + WHICH), (e0 * R_BITS) >> 3,
                                  tmask, D - d0, TB, G, R_BITS)
    code = tl.minimum(tl.maximum(code, 0), YMAX)
    mag = tl.load(lv_ptr + code, mask=m3, other=0.0)
    xf = tl.where(neg, -mag, mag)

    gamma = akv_ptr + tl.load(row + F_GAMMA + WHICH) // ES
    stats = a16_ptr + tl.load(row + F_STATS + WHICH) // 2
    gl = d3 < tl.minimum(tp, 1) * D
    gmin = tl.load(gamma + h * D + d3, mask=gl, other=0.0).to(tl.float32)
    gmax = tl.load(gamma + H * D + h * D + d3, mask=gl, other=0.0).to(tl.float32)
    if not TOKEN_AXIS:
        nct = (tp + C - 1) // C
        sidx = (h * nct + tb) * D + d3
        smask = d3 < D * (tb < nct).to(tl.int32)
        mu = tl.load(stats + sidx, mask=smask, other=0.0).to(tl.float32)
        sg = tl.load(stats + H * nct * D + sidx, mask=smask, other=0.0).to(tl.float32)
        xn = xf * sg + mu
    else:
        ncd = (D + C - 1) // C
        sidx = (h * tp + t) * ncd + d0 // C
        mu = tl.load(stats + sidx, mask=tmask, other=0.0).to(tl.float32)[:, None, None]
        sg = tl.load(stats + H * tp * ncd + sidx, mask=tmask, other=0.0).to(tl.float32)[:, None, None]
        xn = xf * sg + mu
    x = xn * (gmax - gmin) + gmin
    at, ok = _row_address(body0 + t, tmask, slots_ptr, block_size, s_block, s_tok, PAGED)
    if ALIGN > 1:
        at = tl.multiple_of(at, ALIGN)
    tl.store(out + at[:, None, None] + d3 * s_dim, _to_out(x, odt, INTERPRET),
             mask=m3 & ok[:, None, None])
