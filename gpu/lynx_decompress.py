"""Triton: Lynx decompress (anchor-only or full), fused, into a dense [H, T, D] pair or straight
into a paged KV cache (lynx_npu/codec/lynx_ref.py ``dequantize`` + the v1 page layout).

One program = TB tokens of one page x one kv head x all BD >= head_dim channels, for K or V
(WHICH); decoding needs no page-wide reduction (on the channel axis TB <= C, so the tile reads
one row of chunk statistics). The tile is [TB*G, 8]: each thread holds groups of 8
consecutive channels of a token, i.e. one word of packed codes per stream (A_BITS bytes of
anchor, R_BITS of residual) and 16 output bytes (bf16), so code loads and output stores are
whole words / 16-byte vectors and a warp's stores cover whole rows. A value's
(anchor field << R_BITS | residual field) byte indexes one float32 table of signed levels
(ops/tables.py ``signed_levels``; the anchor stage reads residual field 0), then
x' = (level * sigma + mu) * (gmax - gmin) + gmin, rounded to the output dtype. Each value is
written once, to ``out + offset + block*s_block + offset_in_block*s_token + head*s_head +
dim*s_dim`` with ``(block, offset_in_block) = divmod(slot, block_size)``; slot = token for a
dense output, ``slot_mapping[token]`` for a paged cache (negative slots are skipped); see
ops/dest.py.
"""
import triton
import triton.language as tl

from lynx_npu.ops import plan as P

from .lynx_common import section, unpack_fields

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
def _row_address(tok, valid, slots_ptr, block_size, num_slots, s_block, s_tok,
                 PAGED: tl.constexpr, BS_SHIFT: tl.constexpr, SLOTS32: tl.constexpr):
    """Element offset of each token's row (any shape) and whether it is written (slots outside
    [0, num_slots) are not: the API does not read a device slot_mapping back to check it).
    BS_SHIFT >= 0: block_size == 1 << BS_SHIFT (no integer division). SLOTS32: every slot of
    the cache is < 2**31 (the launcher checks), so after the range test the block / offset
    arithmetic is 32-bit and only the final offset is widened."""
    if PAGED:
        slot = tl.load(slots_ptr + tok, mask=valid, other=-1)
        ok = valid & (slot >= 0) & (slot < num_slots)
        s = slot
        if SLOTS32:
            s = slot.to(tl.int32)
        if BS_SHIFT >= 0:
            blk = s >> BS_SHIFT
            off = s & ((1 << BS_SHIFT) - 1)
        else:
            blk = s // block_size
            off = s % block_size
        return blk.to(tl.int64) * s_block + off * s_tok, ok
    else:  # dense: block_size 1, token stride s_block
        return tok * s_block, valid


@triton.jit
def _to_out(x, odt: tl.constexpr, INTERPRET: tl.constexpr):
    """float32 -> the output dtype, saturated to its finite range (codec/base.py to_kv_dtype:
    rounded scalars can put the reconstruction of a finite input a hair past it), then
    rounded to nearest even like torch's .to(dtype).

    Triton's interpreter truncates float32 -> bfloat16, so under TRITON_INTERPRET=1 the
    rounding is done on the bits (finite values); on a GPU the native conversion rounds (RTNE).
    """
    if odt == tl.float16:
        x = tl.minimum(tl.maximum(x, -65504.0), 65504.0)
    elif odt == tl.bfloat16:
        x = tl.minimum(tl.maximum(x, -3.3895313892515355e38), 3.3895313892515355e38)
    else:
        x = tl.minimum(tl.maximum(x, -3.4028234663852886e38), 3.4028234663852886e38)
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
        sl_ptr,                          # float32 [256] signed / anchor levels of this stream
        out_ptr, o_off, s_block, s_tok, s_head, s_dim, block_size, num_slots, slots_ptr,
        lay_ptr,                         # LAYERED: int64 [num_pages, 2] K / V element offsets
                                         # of each page's layer cache from out_ptr's
        H, D,
        WHICH: tl.constexpr, TOKEN_AXIS: tl.constexpr, NTB: tl.constexpr, TB: tl.constexpr,
        G: tl.constexpr, C: tl.constexpr, BS: tl.constexpr, ES: tl.constexpr,
        A_BITS: tl.constexpr, R_BITS: tl.constexpr,
        HAS_RES: tl.constexpr, PAGED: tl.constexpr, INTERPRET: tl.constexpr,
        ALIGN: tl.constexpr, A_WORDS: tl.constexpr, R_WORDS: tl.constexpr,
        EVEN_D: tl.constexpr, SEC: tl.constexpr, BS_SHIFT: tl.constexpr,
        SLOTS32: tl.constexpr = False, HEADS_FAST: tl.constexpr = False,
        LAYERED: tl.constexpr = 0):
    if HEADS_FAST:  # grid (heads, tiles): see launch.py
        pid = tl.program_id(1)
        h = tl.program_id(0)
    else:
        pid = tl.program_id(0)
        h = tl.program_id(1)
    page = pid // NTB
    tb = pid % NTB
    row = plan_ptr + page * NF
    token0 = tl.load(row + F_TOKEN0).to(tl.int32)  # token counts fit int32; byte offsets stay int64
    body0 = tl.load(row + F_BODY0).to(tl.int32)
    tp = tl.load(row + F_NUM_BODY).to(tl.int32)
    ns = tl.load(row + F_NUM_SINK).to(tl.int32)
    BD: tl.constexpr = G * 8
    out = out_ptr + o_off + h * s_head
    if LAYERED:  # pages of several layers in one launch (ops/lynx_serde.py decode_layers);
        # LAYERED: a power of two dividing every layer offset (keeps the stores vectorized)
        lay = tl.load(lay_ptr + page * 2 + WHICH)
        if LAYERED > 1:
            lay = tl.multiple_of(lay, LAYERED)
        out += lay
    odt = out_ptr.dtype.element_ty

    if (ns > 0) & (tb == 0):  # page 0: the exact sink tokens
        s = tl.arange(0, BS)
        dd = tl.arange(0, BD)
        sm = (s < ns)[:, None] & (dd < D)[None, :]
        sink = akv_ptr + tl.load(row + F_SINK + WHICH) // ES
        vals = tl.load(sink + (h * ns + s)[:, None] * D + dd[None, :], mask=sm)
        at, ok = _row_address(token0 + s, s < ns, slots_ptr, block_size, num_slots, s_block,
                              s_tok, PAGED, BS_SHIFT, SLOTS32)
        tl.store(out + at[:, None] + dd[None, :] * s_dim, vals.to(odt), mask=sm & ok[:, None])

    # The tile is [Q = TB*G, 8]: row q is group g = q % G (8 consecutive channels) of token
    # t = q // G, so the only contiguous axis is the last and every Triton version lays it out
    # the same way: 8 values per thread, consecutive groups across lanes.
    Q: tl.constexpr = TB * G
    q = tl.arange(0, Q)
    t = tb * TB + q // G  # tokens of the page body
    g = q % G
    j = tl.arange(0, 8)
    tmask = t < tp
    d2 = g[:, None] * 8 + j[None, :]  # [Q, 8] channels
    if EVEN_D:
        qmask = tmask
    else:
        qmask = tmask & (g * 8 < D)
    grp = (h * tp + t) * (D // 8) + g  # group (8 values) of each row in the code streams
    idx = unpack_fields(a8_ptr, aw_ptr, section(row, F_CODES + WHICH, SEC), grp, qmask, Q,
                        A_BITS, A_WORDS)
    if HAS_RES:  # sl_ptr: signed_levels; else anchor_levels (indexed by the anchor field)
        idx = (idx << R_BITS) | unpack_fields(r8_ptr, rw_ptr, section(row, F_RES + WHICH, SEC),
                                              grp, qmask, Q, R_BITS, R_WORDS)
    # fields are < 256: no mask needed. (Through shared memory with tl.gather this lookup was
    # 16% slower on the H100: the table store and the layout conversions cost more than the
    # L1 lines it saves.)
    xf = tl.load(sl_ptr + idx)

    # Per-channel scalars (and the chunk statistics on the channel axis) are the same for every
    # token of the tile: loaded once as [G, 8] and broadcast over the TB tokens of
    # [TB, G, 8] (the same register layout as [Q, 8]: a thread keeps its group for all its
    # rows), instead of once per row.
    gamma = akv_ptr + section(row, F_GAMMA + WHICH, SEC) // ES
    stats = a16_ptr + section(row, F_STATS + WHICH, SEC) // 2
    dg = tl.arange(0, G)[:, None] * 8 + j[None, :]  # [G, 8] channels
    gm = dg < tl.minimum(tp, 1) * D  # only a page with a body has gamma and statistics
    gmin = tl.load(gamma + h * D + dg, mask=gm, other=0.0).to(tl.float32)[None, :, :]
    gmax = tl.load(gamma + H * D + h * D + dg, mask=gm, other=0.0).to(tl.float32)[None, :, :]
    if not TOKEN_AXIS:  # stats [H, nct, D]: the tile's TB <= C tokens share one row
        nct = (tp + C - 1) // C
        sidx = (h * nct + (tb * TB) // C) * D + dg
        # a tile wholly past the page's last token has no statistics row (gm's form: the
        # interpreter takes only a comparison's mask, not an & of one with a scalar)
        sm = dg < tl.minimum(tp - tb * TB, 1) * D
        mu = tl.load(stats + sidx, mask=sm, other=0.0).to(tl.float32)[None, :, :]
        sg = tl.load(stats + H * nct * D + sidx, mask=sm, other=0.0).to(tl.float32)[None, :, :]
    else:  # stats [H, Tp, ncd]: one value per token per C channels
        ncd = (D + C - 1) // C
        sidx = (h * tp + t) * ncd + g * 8 // C
        mu = tl.reshape(tl.load(stats + sidx, mask=qmask, other=0.0).to(tl.float32),
                        [TB, G])[:, :, None]
        sg = tl.reshape(tl.load(stats + H * tp * ncd + sidx, mask=qmask, other=0.0)
                        .to(tl.float32), [TB, G])[:, :, None]
    x = tl.reshape((tl.reshape(xf, [TB, G, 8]) * sg + mu) * (gmax - gmin) + gmin, [Q, 8])
    at, ok = _row_address(body0 + t, tmask, slots_ptr, block_size, num_slots, s_block, s_tok,
                          PAGED, BS_SHIFT, SLOTS32)
    if ALIGN > 1:
        at = tl.multiple_of(at, ALIGN)
    tl.store(out + at[:, None] + d2 * s_dim, _to_out(x, odt, INTERPRET),
             mask=(qmask & ok)[:, None])
