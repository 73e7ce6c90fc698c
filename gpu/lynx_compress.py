"""Triton: Lynx compress, fused (lynx_npu/codec/lynx_ref.py ``quantize`` + the v1 page layout).

One program = one page x one kv head x one tile of BD channels, for K or V (WHICH). It reads
its [tokens, BD] input tile once into registers, computes page min/max, chunk mean/scale and
codes there, and writes each output once: gamma, chunk statistics, packed anchor and residual
codes, the page-0 sink tokens and (one program per page) the zero alignment padding. Byte
offsets come from the page plan (lynx_npu/ops/plan.py). The chunk tile is [NC, C, BD] for the
channel axis (C tokens of a channel) and [BT, NCD, CE] for the token axis (CE head_dim values
of a token), so chunk reductions are plain axis reductions. The chunk centre is the midrange
(MIDRANGE) or the mean summed in the reference's pairwise tree. ``TREE=False`` (benchmarks
only) sums with tl.sum instead, to measure what the fixed order costs.
"""
import triton
import triton.language as tl

from lynx_npu.ops import plan as P

from .lynx_common import (codes, div_known, minmax, minmax_tiny, pack_store, pack_words, tree_sum_last, tree_sum_mid)

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


@triton.jit
def _pack(vals, bptr, wptr, e0, tmask, ncols, R: tl.constexpr, BD: tl.constexpr,
          BITS: tl.constexpr, WORDS: tl.constexpr):
    if WORDS:  # one word of BITS bytes per group of 8 values
        pack_words(tl.reshape(vals, [R, BD // 8, 8]), wptr, e0 // 8, tmask, ncols, R, BD // 8,
                   BITS)
    else:
        pack_store(vals, bptr, (e0 * BITS) >> 3, tmask, ncols, R, BD, BITS)


@triton.jit
def _codes_and_pack(xf, R: tl.constexpr, BD: tl.constexpr, t, tmask, h, tp, D, d0,
                    codes_off, res_off, a8_ptr, aw_ptr, r8_ptr, rw_ptr,
                    thr_ptr, bucket_ptr, shift, key_lo,
                    A_BITS: tl.constexpr, R_BITS: tl.constexpr, BIAS: tl.constexpr,
                    PROBES: tl.constexpr, A_WORDS: tl.constexpr, R_WORDS: tl.constexpr):
    """xf [R, BD] (rows t) -> packed anchor / residual codes of stream rows (h, t, d0..)."""
    i = codes(xf, thr_ptr, bucket_ptr, shift, key_lo, PROBES)
    m = (i + BIAS) >> R_BITS
    res = (m << R_BITS) - i
    anc = m ^ (xf < 0).to(tl.int32) * -1  # -m - 1 == ~m where the centred value is negative
    e0 = (h * tp + t) * D + d0  # stream position of each row's first value (multiple of 8)
    _pack(anc, a8_ptr + codes_off, aw_ptr + codes_off // A_BITS, e0, tmask, D - d0, R, BD,
          A_BITS, A_WORDS)
    _pack(res, r8_ptr + res_off, rw_ptr + res_off // R_BITS, e0, tmask, D - d0, R, BD, R_BITS,
          R_WORDS)


@triton.jit
def _min_max_min(a_lo, a_hi, a_t, b_lo, b_hi, b_t):
    return tl.minimum(a_lo, b_lo), tl.maximum(a_hi, b_hi), tl.minimum(a_t, b_t)


@triton.jit
def _normalise(x, xmin, scale, tiny, m, SAFE_MIN: tl.constexpr):
    """(x - gmin) / scale, 0 where scale == 0, rounded like IEEE division.

    With a reciprocal per channel and two FMAs (div_known) when every column of the tile is
    safe for it: nonzero |x| >= SAFE_MIN (so nonzero x - gmin >= 2**-102: 2**-95 for bfloat16,
    2**-79 for float32 inputs, any float16) and scale <= 2**24 (normal quotients); else (never on
    real KV) IEEE division. ``tiny`` is the smallest nonzero |x| per column, ``m`` the column
    mask."""
    sc = tl.where(scale > 0, scale, 1.0)
    ok = (scale <= 16777216.0) | (m == 0)
    if SAFE_MIN > 0:
        ok = ok & ((tiny >= SAFE_MIN) | (m == 0))
    if tl.min(ok.to(tl.int32)) == 1:
        xn = div_known(x - xmin, sc, tl.math.div_rn(tl.full(sc.shape, 1.0, tl.float32), sc))
    else:
        xn = tl.math.div_rn(x - xmin, sc)
    return tl.where(scale > 0, xn, 0.0)


@triton.jit
def lynx_compress_kernel(
        x_ptr, s_h, s_t, s_d,            # K or V [H, T, D] and its strides (elements)
        a8_ptr, akv_ptr, a16_ptr,        # the anchor buffer as uint8 / KV dtype / float16
        aw_ptr,                          # ... as words of A_BITS bytes (A_BITS in 1, 2, 4)
        r8_ptr, rw_ptr,                  # the residual buffer as uint8 / words of R_BITS bytes
        plan_ptr,                        # int64 [num_pages, NF]
        thr_ptr, bucket_ptr, shift, key_lo,  # this stream's tables (ops/tables.py)
        H, D, NUM_DT,
        WHICH: tl.constexpr, TOKEN_AXIS: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
        C: tl.constexpr, CE: tl.constexpr, BS: tl.constexpr, ES: tl.constexpr,
        A_BITS: tl.constexpr, R_BITS: tl.constexpr, BIAS: tl.constexpr, PROBES: tl.constexpr,
        MIDRANGE: tl.constexpr, SAFE_MIN: tl.constexpr, A_WORDS: tl.constexpr,
        R_WORDS: tl.constexpr, TREE: tl.constexpr = True):
    dt = tl.program_id(0) % NUM_DT  # channel tiles vary fastest: neighbours share input rows
    page = tl.program_id(0) // NUM_DT
    h = tl.program_id(1)
    row = plan_ptr + page * NF
    token0 = tl.load(row + F_TOKEN0).to(tl.int32)  # token counts fit int32; byte offsets stay int64
    body0 = tl.load(row + F_BODY0).to(tl.int32)
    tp = tl.load(row + F_NUM_BODY).to(tl.int32)
    ns = tl.load(row + F_NUM_SINK).to(tl.int32)
    d0 = dt * BD
    xh = x_ptr + h * s_h
    dd = d0 + tl.arange(0, BD)
    dmask = dd < D

    if ns > 0:  # page 0: the exact sink tokens, [H, ns, D] in the KV dtype
        s = tl.arange(0, BS)
        sm = (s < ns)[:, None] & dmask[None, :]
        xs = tl.load(xh + (token0 + s)[:, None] * s_t + dd[None, :] * s_d, mask=sm)
        sink = akv_ptr + tl.load(row + F_SINK + WHICH) // ES
        tl.store(sink + (h * ns + s)[:, None] * D + dd[None, :], xs, mask=sm)
    if WHICH == 0:
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

    gamma = akv_ptr + tl.load(row + F_GAMMA + WHICH) // ES
    stats = a16_ptr + tl.load(row + F_STATS + WHICH) // 2
    codes_off = tl.load(row + F_CODES + WHICH)
    res_off = tl.load(row + F_RES + WHICH)
    if not TOKEN_AXIS:
        # [NC, C, BD]: chunk c holds tokens c*C .. c*C + C - 1 of each channel
        NC: tl.constexpr = BT // C
        c = tl.arange(0, NC)
        t3 = (c[:, None] * C + tl.arange(0, C)[None, :])[:, :, None]
        m3 = (t3 < tp) & dmask[None, None, :]
        x = tl.load(xh + (body0 + t3) * s_t + dd[None, None, :] * s_d, mask=m3,
                    other=0.0).to(tl.float32)
        gmin, gmax, tiny = minmax_tiny(x, m3, 1)
        gmin, gmax, tiny = tl.reduce((gmin, gmax, tiny), 0, _min_max_min)
        xn = _normalise(x, gmin[None, None, :], (gmax - gmin)[None, None, :],
                        tiny[None, None, :], dmask.to(tl.int32)[None, None, :], SAFE_MIN)
        xn = tl.where(m3, xn, 0.0)
        if MIDRANGE:
            lo, hi = minmax(xn, m3, 1)
            mu = ((hi + lo) * 0.5).to(tl.float16)  # * 0.5 == / 2 exactly
        else:
            count = tl.maximum(tl.minimum(tp - c * C, C), 1).to(tl.float32)
            csum = tree_sum_mid(xn, NC, C, BD) if TREE else tl.sum(xn, axis=1)
            mu = tl.math.div_rn(csum, count[:, None]).to(tl.float16)
        xc = xn - mu.to(tl.float32)[:, None, :]
        sigma = tl.max(tl.where(m3, tl.abs(xc), 0.0), axis=1).to(tl.float16)
        sg = tl.where(sigma > 0, sigma.to(tl.float32), 1.0)
        # codes only compare |xf| with thresholds >= 5e-8: the FMA division is exact where it
        # matters (|xc| >= 2**-102) and keeps the sign everywhere
        xf = tl.where((sigma > 0)[:, None, :],
                      div_known(xc, sg[:, None, :], tl.math.div_rn(tl.full(sg.shape, 1.0, tl.float32), sg)[:, None, :]),
                      0.0)
        nct = (tp + C - 1) // C
        sidx = (h * nct + c[:, None]) * D + dd[None, :]
        smask = (c < nct)[:, None] & dmask[None, :]
        tl.store(stats + sidx, mu, mask=smask)
        tl.store(stats + H * nct * D + sidx, sigma, mask=smask)
        t = tl.arange(0, BT)
        _codes_and_pack(tl.reshape(xf, [BT, BD]), BT, BD, t, t < tp, h, tp, D, d0, codes_off,
                        res_off, a8_ptr, aw_ptr, r8_ptr, rw_ptr, thr_ptr, bucket_ptr, shift,
                        key_lo, A_BITS, R_BITS, BIAS, PROBES, A_WORDS, R_WORDS)
    else:
        # [BT, NCD, CE]: chunk (t, cd) holds head_dim values d0 + cd*CE .. of token t
        NCD: tl.constexpr = BD // CE
        t = tl.arange(0, BT)
        cd = tl.arange(0, NCD)
        d3 = (d0 + cd[:, None] * CE + tl.arange(0, CE)[None, :])[None, :, :]
        tm3 = (t < tp)[:, None, None]
        m3 = tm3 & (d3 < D)
        x = tl.load(xh + (body0 + t)[:, None, None] * s_t + d3 * s_d, mask=m3,
                    other=0.0).to(tl.float32)
        gmin, gmax, tiny = minmax_tiny(x, m3, 0)  # [NCD, CE]
        xn = _normalise(x, gmin[None, :, :], (gmax - gmin)[None, :, :], tiny[None, :, :],
                        (d3 < D).to(tl.int32), SAFE_MIN)
        xn = tl.where(m3, xn, 0.0)
        c0 = d0 + cd * CE  # first head_dim index of each chunk
        if MIDRANGE:
            lo, hi = minmax(xn, m3, 2)
            mu = ((hi + lo) * 0.5).to(tl.float16)
        else:
            count = tl.maximum(tl.minimum(D - c0, C), 1).to(tl.float32)
            csum = tree_sum_last(xn, BT, NCD, CE) if TREE else tl.sum(xn, axis=2)
            mu = tl.math.div_rn(csum, count[None, :]).to(tl.float16)
        xc = xn - mu.to(tl.float32)[:, :, None]
        sigma = tl.max(tl.where(m3, tl.abs(xc), 0.0), axis=2).to(tl.float16)
        sg = tl.where(sigma > 0, sigma.to(tl.float32), 1.0)
        xf = tl.where((sigma > 0)[:, :, None],
                      div_known(xc, sg[:, :, None], tl.math.div_rn(tl.full(sg.shape, 1.0, tl.float32), sg)[:, :, None]),
                      0.0)
        ncd = (D + C - 1) // C
        sidx = (h * tp + t[:, None]) * ncd + (c0 // C)[None, :]
        smask = (t < tp)[:, None] & (c0 < D)[None, :]
        tl.store(stats + sidx, mu, mask=smask)
        tl.store(stats + H * tp * ncd + sidx, sigma, mask=smask)
        gmin = tl.reshape(gmin, [BD])
        gmax = tl.reshape(gmax, [BD])
        _codes_and_pack(tl.reshape(xf, [BT, BD]), BT, BD, t, t < tp, h, tp, D, d0, codes_off,
                        res_off, a8_ptr, aw_ptr, r8_ptr, rw_ptr, thr_ptr, bucket_ptr, shift,
                        key_lo, A_BITS, R_BITS, BIAS, PROBES, A_WORDS, R_WORDS)
    gdt = akv_ptr.dtype.element_ty
    tl.store(gamma + h * D + dd, gmin.to(gdt), mask=dd < tl.minimum(tp, 1) * D)
    tl.store(gamma + H * D + h * D + dd, gmax.to(gdt), mask=dd < tl.minimum(tp, 1) * D)
