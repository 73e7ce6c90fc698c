/*
 * Lynx compress kernel (Ascend C, AI Vector cores): K, V of one layer -> every page's anchor
 * buffer (packed anchor codes, then gamma, chunk statistics, sinks) and residual buffer, in wire
 * format v1. The math is lynx_npu/codec/lynx_ref.py, float32 in the same order:
 *
 *   gmin, gmax = min, max per channel over the page     (exact: they are input values)
 *   xn = (x - gmin) * inv_scale   (inv_scale = RN(1 / (gmax - gmin)), 0 where not finite, so a
 *                                  constant channel gives 0)
 *   c = (max + min) / 2 over chunk         (tiling center LYNX_CENTER_MIDRANGE, the default)
 *     = sum(xn over chunk) / count         (LYNX_CENTER_MEAN, the paper's)
 *   mu = f16(c)                            (tiling scalarGrid LYNX_GRID_FLOAT16)
 *      = u / 256, u = min(255, max(0, floor(256 c + 1/2)))   (LYNX_GRID_BYTE: StoreMu)
 *   xc = xn - mu;  need = max |xc| over chunk  (midrange: max(hi - mu, mu - lo), the same
 *                                               float32 value, see MidrangeStats)
 *   sigma = f16(need)                      (float16 grid)
 *         = levels[min(255, #{j : levels[j] < need})]   (byte grid: the smallest of the 256
 *           sigma levels >= need, a float16 value; binary search as below, SigmaStats)
 *   xf = xc * RN(1 / sigma)  (0 where sigma == 0)
 *   I = #{j : thresholds[j] <= |xf|}       (branch-free binary search: Gather + Compare + Select)
 *   m = (I + bias) >> r;  d = (m << r) - I;  anchor = xf < 0 ? -m - 1 : m
 *                                      (a anchor + r residual bits: K's and V's own split)
 *   res = d                  in a middle cell (0 < m < top = y_max >> r)
 *       = 2 d + 1 - h        in an end cell (m == 0 or m == top), h = |xf| >= split[I]
 *         (payload format 8, lynx_tables "the end cells"), stored mod 2^r
 *
 * The midrange has no rounding-order freedom (max, min, one add, an exact halving), so its
 * streams equal the reference's byte for byte, on either scalar grid. With the mean, the only
 * value that can differ is a channel-axis chunk sum: the reference adds adjacent pairs
 * (lynx_ref.tree_sum), as the token-axis WholeReduceSum does, while FoldRows folds the upper
 * half of the rows onto the lower half, a different order; and only when the float32 mean lies
 * within a rounding error of a rounding boundary of mu (float16, or the byte grid's half-steps);
 * see ascend_c/README.
 *
 * Pipeline per work item (page, K|V, head): pass 1 streams the page's row blocks through the
 * double-buffered input queue to get gamma; pass 2 streams them again:
 *   CopyIn (MTE2: rows -> inQueue) -> ComputeQuant (V) -> CopyOut (MTE3: codes, stats -> GM).
 */
#include "lynx_kernel_common.h"

namespace lynx {

template <typename T>
class LynxCompress {
public:
    __aicore__ inline LynxCompress() {}

    __aicore__ inline void Init(GM_ADDR k, GM_ADDR v, GM_ADDR kThr, GM_ADDR vThr, GM_ADDR kSplit, GM_ADDR vSplit,
                                GM_ADDR sigLevels, GM_ADDR anchor, GM_ADDR residual, const LynxTiling* tiling,
                                AscendC::TPipe* pipe)
    {
        t_ = tiling;
        byteGrid_ = t_->scalarGrid == LYNX_GRID_BYTE;
        anchor_ = anchor;
        residual_ = residual;
        const uint64_t layer = (uint64_t)t_->numHeads * t_->numTokens * t_->headDim;
        kvGm_[0].SetGlobalBuffer(reinterpret_cast<__gm__ T*>(k), layer);
        kvGm_[1].SetGlobalBuffer(reinterpret_cast<__gm__ T*>(v), layer);
        thrGm_[0].SetGlobalBuffer(reinterpret_cast<__gm__ float*>(kThr), t_->tableSize);
        thrGm_[1].SetGlobalBuffer(reinterpret_cast<__gm__ float*>(vThr), t_->tableSize);
        splitGm_[0].SetGlobalBuffer(reinterpret_cast<__gm__ float*>(kSplit), t_->tableSize);
        splitGm_[1].SetGlobalBuffer(reinterpret_cast<__gm__ float*>(vSplit), t_->tableSize);
        if (byteGrid_) sigGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(sigLevels), t_->sigmaTableSize);
        anchorGm_.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(anchor), t_->anchorTotal);
        residualGm_.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(residual), t_->residualTotal);

        const uint32_t d = t_->headDim, es = sizeof(T), np = t_->blockElems, sb = t_->subBlock;
        const uint32_t stats = t_->maxStats;
        pipe->InitBuffer(tableQueue_, 1, (LYNX_COMPRESS_TABLES * t_->tableSize + (byteGrid_ ? t_->sigmaTableSize : 0)) *
                                             sizeof(float));
        if (t_->numSink) pipe->InitBuffer(sinkQueue_, BUFFER_NUM, t_->sinkRows * d * es);
        pipe->InitBuffer(inQueue_, BUFFER_NUM, t_->maxBlockRows * d * es);
        pipe->InitBuffer(codeQueue_, BUFFER_NUM, LynxCodeBytes(*t_, np, false));
        pipe->InitBuffer(resQueue_, BUFFER_NUM, LynxCodeBytes(*t_, np, true));
        pipe->InitBuffer(statsQueue_, BUFFER_NUM, stats * 2 * sizeof(half));
        pipe->InitBuffer(gammaQueue_, 1, 2 * d * es);
        pipe->InitBuffer(xBuf_, np * sizeof(float));
        pipe->InitBuffer(workBuf_, np * sizeof(float));
        pipe->InitBuffer(sumBuf_, stats * sizeof(float));
        pipe->InitBuffer(cntBuf_, stats * sizeof(float));
        pipe->InitBuffer(muBuf_, stats * sizeof(float));
        pipe->InitBuffer(sigBuf_, stats * sizeof(float));
        if (t_->axis[0] == LYNX_AXIS_TOKEN || t_->axis[1] == LYNX_AXIS_TOKEN)
            pipe->InitBuffer(spreadBuf_, stats * BLOCK_FLOATS * sizeof(float));
        pipe->InitBuffer(gminBuf_, t_->dimPad * sizeof(float));
        pipe->InitBuffer(gmaxBuf_, t_->dimPad * sizeof(float));
        pipe->InitBuffer(invScaleBuf_, t_->dimPad * sizeof(float));
        pipe->InitBuffer(rowMaskBuf_, t_->dimPad / 8);
        pipe->InitBuffer(f1Buf_, sb * sizeof(float));
        pipe->InitBuffer(f2Buf_, sb * sizeof(float));
        pipe->InitBuffer(f3Buf_, sb * sizeof(float));
        pipe->InitBuffer(offBuf_, sb * sizeof(int32_t));
        pipe->InitBuffer(maskBuf_, sb / 8);
        pipe->InitBuffer(sigMaskBuf_, stats / 8);
        pipe->InitBuffer(shiftBuf_, LYNX_CODE_STREAMS * LYNX_PACK_PATTERNS * LYNX_ALIGN);
    }

    __aicore__ inline void Process()
    {
        AscendC::LocalTensor<float> tables = tableQueue_.AllocTensor<float>();
        AscendC::DataCopy(tables, thrGm_[0], t_->tableSize);
        AscendC::DataCopy(tables[t_->tableSize], thrGm_[1], t_->tableSize);
        AscendC::DataCopy(tables[2 * t_->tableSize], splitGm_[0], t_->tableSize);
        AscendC::DataCopy(tables[3 * t_->tableSize], splitGm_[1], t_->tableSize);
        if (byteGrid_) AscendC::DataCopy(tables[LYNX_COMPRESS_TABLES * t_->tableSize], sigGm_, t_->sigmaTableSize);
        tableQueue_.EnQue(tables);
        tables_ = tableQueue_.DeQue<float>();
        BuildShifts();

        const uint32_t blocks = (uint32_t)AscendC::GetBlockNum();
        const uint32_t per = CeilDiv(t_->numWork, blocks);
        const uint32_t begin = (uint32_t)AscendC::GetBlockIdx() * per;
        const uint32_t end = Min(t_->numWork, begin + per);
        for (uint32_t item = begin; item < end; ++item) ProcessItem(item);

        tableQueue_.FreeTensor(tables_);
    }

private:
    // 2^shift of each group lane, per code stream (K anchor, K residual, V anchor, V residual).
    __aicore__ inline void BuildShifts()
    {
        for (uint32_t st = 0; st < LYNX_CODE_STREAMS; ++st) {
            const uint32_t b = StreamBits(st);
            float shift[BLOCK_FLOATS];
            for (uint32_t u = 0; u < BLOCK_FLOATS; ++u) shift[u] = (float)(1u << LaneShift(b, u));
            SetLanes(shiftBuf_.Get<float>()[st * BLOCK_FLOATS], shift);
        }
    }

    // Stream st = 2 * kv + (residual ? 1 : 0): its code bits.
    __aicore__ inline uint32_t StreamBits(uint32_t st) const
    {
        return st % 2 ? t_->residualBits[st / 2] : t_->anchorBits[st / 2];
    }

    __aicore__ inline void ProcessItem(uint32_t item)
    {
        const uint32_t h = item % t_->numHeads;
        const uint32_t kv = (item / t_->numHeads) % 2;
        const uint32_t page = item / (2 * t_->numHeads);
        const LynxPageKind& pk = t_->kind[LynxKindOf(*t_, page)];
        const uint64_t aBase = LynxAnchorBase(*t_, page);
        const uint64_t rBase = LynxResidualBase(*t_, page);
        const uint32_t d = t_->headDim, tp = pk.numTokens;
        if (pk.numSink) CopySinks(kv, h, aBase + pk.offset[LYNX_K_SINK + kv]);
        if (tp == 0) return;

        const uint64_t src = ((uint64_t)h * t_->numTokens + LynxBodyStart(*t_, page)) * d;
        const uint32_t rowsPer = t_->rowsPerBlock[kv];
        AscendC::LocalTensor<float> gmin = gminBuf_.Get<float>();
        AscendC::LocalTensor<float> gmax = gmaxBuf_.Get<float>();
        AscendC::Duplicate(gmin, F_INF, t_->dimPad);
        AscendC::Duplicate(gmax, -F_INF, t_->dimPad);
        for (uint32_t r0 = 0; r0 < tp; r0 += rowsPer) {   // pass 1: per-channel page min / max
            const uint32_t rows = Min(rowsPer, tp - r0);
            CopyIn(src + (uint64_t)r0 * d, kv, rows);
            ComputeGamma(rows);
        }
        CopyOutGamma(kv, h, aBase + pk.offset[LYNX_K_GAMMA + kv]);
        for (uint32_t r0 = 0; r0 < tp; r0 += rowsPer) {   // pass 2: quantize
            const uint32_t rows = Min(rowsPer, tp - r0);
            CopyIn(src + (uint64_t)r0 * d, kv, rows);
            const uint32_t nstat = ComputeQuant(kv, rows);
            CopyOut(kv, h, pk, aBase, rBase, r0, rows, nstat);
        }
    }

    __aicore__ inline void CopyIn(uint64_t src, uint32_t kv, uint32_t rows)
    {
        AscendC::LocalTensor<T> in = inQueue_.AllocTensor<T>();
        AscendC::DataCopy(in, kvGm_[kv][src], rows * t_->headDim);
        inQueue_.EnQue(in);
    }

    // Sinks go to the anchor as they are: GM -> UB -> GM through a bound VECIN/VECOUT queue.
    __aicore__ inline void CopySinks(uint32_t kv, uint32_t h, uint64_t dstByte)
    {
        const uint32_t d = t_->headDim, ns = t_->numSink;
        AscendC::GlobalTensor<T> dst;
        dst.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(anchor_ + dstByte), (uint64_t)t_->numHeads * ns * d);
        for (uint32_t r = 0; r < ns; r += t_->sinkRows) {
            const uint32_t rows = Min(t_->sinkRows, ns - r);
            AscendC::LocalTensor<T> s = sinkQueue_.AllocTensor<T>();
            AscendC::DataCopy(s, kvGm_[kv][((uint64_t)h * t_->numTokens + r) * d], rows * d);
            sinkQueue_.EnQue(s);
            s = sinkQueue_.DeQue<T>();
            AscendC::DataCopy(dst[((uint64_t)h * ns + r) * d], s, rows * d);
            sinkQueue_.FreeTensor(s);
        }
    }

    // Loads a dequeued row block into x as float32, zero-filling the padding to a whole repeat.
    __aicore__ inline uint32_t LoadRows(uint32_t rows)
    {
        const uint32_t n = rows * t_->headDim, np = LynxRoundUp(n, REPEAT_FLOATS);
        AscendC::LocalTensor<T> in = inQueue_.DeQue<T>();
        AscendC::LocalTensor<float> x = xBuf_.Get<float>();
        AscendC::Cast(x, in, AscendC::RoundMode::CAST_NONE, n);
        inQueue_.FreeTensor(in);
        if (np > n) AscendC::Duplicate(x[n], 0.0f, np - n);
        return np;
    }

    __aicore__ inline void ComputeGamma(uint32_t rows)
    {
        const uint32_t d = t_->headDim, np = LoadRows(rows);
        AscendC::LocalTensor<float> x = xBuf_.Get<float>();
        AscendC::LocalTensor<float> w = workBuf_.Get<float>();
        AscendC::DataCopy(w, x, np);
        FoldRows(Op::MIN, x, rows, d);
        FoldRows(Op::MAX, w, rows, d);
        AscendC::Min(gminBuf_.Get<float>(), gminBuf_.Get<float>(), x, d);
        AscendC::Max(gmaxBuf_.Get<float>(), gmaxBuf_.Get<float>(), w, d);
    }

    __aicore__ inline void CopyOutGamma(uint32_t kv, uint32_t h, uint64_t dstByte)
    {
        const uint32_t d = t_->headDim;
        AscendC::LocalTensor<float> gmin = gminBuf_.Get<float>();
        AscendC::LocalTensor<float> gmax = gmaxBuf_.Get<float>();
        AscendC::LocalTensor<T> g = gammaQueue_.AllocTensor<T>();
        CastToKv(g, gmin, d);  // exact: gamma values are input values
        CastToKv(g[d], gmax, d);
        gammaQueue_.EnQue(g);
        // inv_scale = RN(1 / (gmax - gmin)), 0 for a constant channel (gmax is free from here)
        AscendC::LocalTensor<float> invScale = invScaleBuf_.Get<float>();
        AscendC::Sub(invScale, gmax, gmin, t_->dimPad);
        ReciprocalOrZero(invScale, gmax, rowMaskBuf_.Get<uint8_t>(), t_->dimPad);

        g = gammaQueue_.DeQue<T>();
        AscendC::GlobalTensor<T> dst;
        dst.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(anchor_ + dstByte), 2ull * t_->numHeads * d);
        AscendC::DataCopy(dst[(uint64_t)h * d], g, d);                              // page min
        AscendC::DataCopy(dst[((uint64_t)t_->numHeads + h) * d], g[d], d);          // page max
        gammaQueue_.FreeTensor(g);
    }

    // Normalises the block, writes mu / sigma to the stats queue, quantizes into the code queues.
    // Returns the number of chunk statistics of the block.
    __aicore__ inline uint32_t ComputeQuant(uint32_t kv, uint32_t rows)
    {
        const uint32_t d = t_->headDim, c = t_->chunkSize[kv], n = rows * d;
        const uint32_t np = LoadRows(rows);
        AscendC::LocalTensor<float> x = xBuf_.Get<float>();
        AscendC::LocalTensor<float> w = workBuf_.Get<float>();
        AscendC::LocalTensor<float> sum = sumBuf_.Get<float>();
        AscendC::LocalTensor<float> cnt = cntBuf_.Get<float>();
        AscendC::LocalTensor<float> mu = muBuf_.Get<float>();
        AscendC::LocalTensor<float> sig = sigBuf_.Get<float>();
        RowBroadcast(Op::SUB, x, x, gminBuf_.Get<float>(), rows, d);
        RowBroadcast(Op::MUL, x, x, invScaleBuf_.Get<float>(), rows, d);

        AscendC::LocalTensor<half> stats = statsQueue_.AllocTensor<half>();  // [mu | sigma]
        const uint32_t ms = t_->maxStats;
        const bool midrange = t_->center == LYNX_CENTER_MIDRANGE;
        uint32_t nstat;
        if (t_->axis[kv] == LYNX_AXIS_CHANNEL) {
            const uint32_t nch = CeilDiv(rows, c);
            nstat = nch * d;
            AscendC::DataCopy(w, x, np);
            if (midrange) {  // sum <- chunk max, cnt <- chunk min (each chunk's rows folded)
                ChannelChunks(Op::MAX, w, sum, rows, c);
                AscendC::DataCopy(w, x, np);
                ChannelChunks(Op::MIN, w, cnt, rows, c);
                MidrangeStats(stats, mu, sum, cnt, nstat);
            } else {
                ChannelChunks(Op::ADD, w, sum, rows, c);
                AscendC::Duplicate(cnt, (float)c, nstat);
                if (rows % c) AscendC::Duplicate(cnt[(nch - 1) * d], (float)(rows % c), d);
                MeanStats(stats, mu, sum, cnt, nstat);
            }
            for (uint32_t k = 0; k < nch; ++k)
                RowBroadcast(Op::SUB, x[k * c * d], x[k * c * d], mu[k * d], Min(c, rows - k * c), d);
            if (!midrange) {  // sum <- max |xc| over each chunk
                AscendC::Abs(w, x, n);
                ChannelChunks(Op::MAX, w, sum, rows, c);
            }
            SigmaStats(stats[ms], sig, sum, nstat);
            ReciprocalOrZero(sig, cnt, sigMaskBuf_.Get<uint8_t>(), LynxRoundUp(nstat, REPEAT_FLOATS));
            for (uint32_t k = 0; k < nch; ++k)
                RowBroadcast(Op::MUL, x[k * c * d], x[k * c * d], sig[k * d], Min(c, rows - k * c), d);
        } else {
            const uint32_t tc = t_->tokenChunk[kv];  // values per chunk
            nstat = rows * (d / tc);
            AscendC::LocalTensor<float> spread = spreadBuf_.Get<float>();
            const int32_t cBlocks = (int32_t)(tc / BLOCK_FLOATS);
            if (midrange) {  // sum <- chunk max, cnt <- chunk min (one repeat per chunk)
                for (uint32_t r0 = 0; r0 < nstat; r0 += REDUCE_STEP) {
                    const int32_t rep = (int32_t)Min(REDUCE_STEP, nstat - r0);
                    AscendC::WholeReduceMax(sum[r0], x[r0 * tc], (int32_t)tc, rep, 1, 1, cBlocks,
                                            AscendC::ReduceOrder::ORDER_ONLY_VALUE);
                    AscendC::WholeReduceMin(cnt[r0], x[r0 * tc], (int32_t)tc, rep, 1, 1, cBlocks,
                                            AscendC::ReduceOrder::ORDER_ONLY_VALUE);
                }
                MidrangeStats(stats, mu, sum, cnt, nstat);
            } else {
                for (uint32_t r0 = 0; r0 < nstat; r0 += REDUCE_STEP)
                    AscendC::WholeReduceSum(sum[r0], x[r0 * tc], (int32_t)tc, (int32_t)Min(REDUCE_STEP, nstat - r0),
                                            1, 1, cBlocks);
                AscendC::Duplicate(cnt, (float)tc, nstat);
                MeanStats(stats, mu, sum, cnt, nstat);
            }
            ChunkBroadcast(Op::SUB, x, x, mu, spread, nstat, tc);
            if (!midrange) {  // sum <- max |xc| over each chunk
                AscendC::Abs(w, x, n);
                for (uint32_t r0 = 0; r0 < nstat; r0 += REDUCE_STEP)
                    AscendC::WholeReduceMax(sum[r0], w[r0 * tc], (int32_t)tc, (int32_t)Min(REDUCE_STEP, nstat - r0),
                                            1, 1, cBlocks, AscendC::ReduceOrder::ORDER_ONLY_VALUE);
            }
            SigmaStats(stats[ms], sig, sum, nstat);
            ReciprocalOrZero(sig, cnt, sigMaskBuf_.Get<uint8_t>(), LynxRoundUp(nstat, REPEAT_FLOATS));
            ChunkBroadcast(Op::MUL, x, x, sig, spread, nstat, tc);
        }
        statsQueue_.EnQue(stats);

        AscendC::LocalTensor<uint8_t> codes = codeQueue_.AllocTensor<uint8_t>();
        AscendC::LocalTensor<uint8_t> res = resQueue_.AllocTensor<uint8_t>();
        const AscendC::LocalTensor<float> thr = tables_[kv * t_->tableSize];
        const AscendC::LocalTensor<float> split = tables_[(2 + kv) * t_->tableSize];
        const uint32_t a = t_->anchorBits[kv], r = t_->residualBits[kv];
        // a sub-block's codes start 32-byte aligned: subBlock is 2048 (s * a / 8 = 256 * a * k)
        // or the whole block (s = 0)
        for (uint32_t s = 0; s < np; s += t_->subBlock)
            Quantize(kv, x[s], Min(t_->subBlock, np - s), codes[s * a / 8], res[s * r / 8], thr, split);
        codeQueue_.EnQue(codes);
        resQueue_.EnQue(res);
        return nstat;
    }

    // Mean centre: c = sum / count, mu = f16(c) or on the byte grid -> stats[0, nstat) (float16)
    // and mu (float32).
    __aicore__ inline void MeanStats(const AscendC::LocalTensor<half>& stats, const AscendC::LocalTensor<float>& mu,
                                     const AscendC::LocalTensor<float>& sum, const AscendC::LocalTensor<float>& cnt,
                                     uint32_t nstat)
    {
        AscendC::Div(sum, sum, cnt, nstat);
        StoreMu(stats, mu, sum, nstat);
    }

    // Midrange centre: c = (hi + lo) / 2, mu = f16(c) or on the byte grid -> stats[0, nstat) and
    // mu (float32); then hi <- max(hi - mu, mu - lo), which is max |xn - mu| over the chunk
    // before sigma is rounded (float16) or snapped (byte grid): float32 subtraction rounds
    // monotonically, so the chunk's largest and smallest values give the largest |RN(x - mu)|
    // (the CPU kernel's identity), and no pass over the block's values is needed.
    __aicore__ inline void MidrangeStats(const AscendC::LocalTensor<half>& stats, const AscendC::LocalTensor<float>& mu,
                                         const AscendC::LocalTensor<float>& hi, const AscendC::LocalTensor<float>& lo,
                                         uint32_t nstat)
    {
        AscendC::Add(mu, hi, lo, nstat);
        AscendC::Muls(mu, mu, 0.5f, nstat);  // * 0.5 == / 2 exactly (IEEE, both correctly rounded)
        StoreMu(stats, mu, mu, nstat);
        AscendC::Sub(hi, hi, mu, nstat);
        AscendC::Sub(lo, mu, lo, nstat);
        AscendC::Max(hi, hi, lo, nstat);
    }

    // centre c (float32, clobbered on the byte grid) -> mu: stats[0, nstat) (float16) and mu
    // (float32, the float16 value). Float16 grid: f16(c). Byte grid: u / 256 with
    // u = min(255, max(0, floor(256 c + 1/2))): 256 c is exact (a power of two), + 1/2 rounds as
    // the reference's float32 add does, CAST_FLOOR to int32 and back is exact below 2^24, and
    // u / 256 is a float16 value, so the float16 store and reload are exact. The sigma buffer is
    // free here (sigma comes after mu) and holds the int32 floors.
    __aicore__ inline void StoreMu(const AscendC::LocalTensor<half>& stats, const AscendC::LocalTensor<float>& mu,
                                   const AscendC::LocalTensor<float>& c, uint32_t nstat)
    {
        if (byteGrid_) {
            AscendC::LocalTensor<int32_t> u = sigBuf_.Get<int32_t>();
            AscendC::Muls(c, c, 256.0f, nstat);
            AscendC::Adds(c, c, 0.5f, nstat);
            AscendC::Cast(u, c, AscendC::RoundMode::CAST_FLOOR, nstat);
            AscendC::Cast(c, u, AscendC::RoundMode::CAST_NONE, nstat);
            AscendC::Maxs(c, c, 0.0f, nstat);
            AscendC::Mins(c, c, 255.0f, nstat);
            AscendC::Muls(c, c, 1.0f / 256, nstat);  // exact: a power of two
        }
        AscendC::Cast(stats, c, AscendC::RoundMode::CAST_RINT, nstat);
        AscendC::Cast(mu, stats, AscendC::RoundMode::CAST_NONE, nstat);
    }

    // need = max |xc| of each chunk (clobbered) -> sigma: float16 in stats (the block's sigma
    // half) and float32 in sig. Float16 grid: f16(need). Byte grid: levels[idx], idx =
    // min(255, #{j : levels[j] < need}), the smallest level >= need (levels increase from
    // levels[0] = 0, so a constant chunk gets 0): the branch-free binary search of Quantize over
    // the 256 levels, 8 steps of Gather + Compare(LT) + Select, idx kept as a byte offset
    // (exact integers); it ends at 255 at most, which is the clamp. Each level is a float16
    // value, so the float16 store is exact. Scratch: sig (the offset), the count buffer (free
    // once mu is out) and the work buffer (int32 offsets; maxStats <= blockElems), whole
    // repeats for Compare (the lanes past nstat are never stored).
    __aicore__ inline void SigmaStats(const AscendC::LocalTensor<half>& stats, const AscendC::LocalTensor<float>& sig,
                                      const AscendC::LocalTensor<float>& need, uint32_t nstat)
    {
        if (byteGrid_) {
            const uint32_t n = LynxRoundUp(nstat, REPEAT_FLOATS);
            const AscendC::LocalTensor<float> levels = tables_[LYNX_COMPRESS_TABLES * t_->tableSize];
            AscendC::LocalTensor<float> pos = sig;
            AscendC::LocalTensor<float> tmp = cntBuf_.Get<float>();
            AscendC::LocalTensor<int32_t> off = workBuf_.Get<int32_t>();
            AscendC::LocalTensor<uint8_t> mask = sigMaskBuf_.Get<uint8_t>();
            AscendC::Duplicate(pos, 0.0f, n);
            for (uint32_t step = t_->sigmaTableSize / 2; step >= 1; step /= 2) {
                AscendC::Adds(tmp, pos, (float)((step - 1) * sizeof(float)), n);  // levels[idx + step - 1]
                AscendC::Cast(off, tmp, AscendC::RoundMode::CAST_RINT, n);
                AscendC::Gather(tmp, levels, off.ReinterpretCast<uint32_t>(), 0, n);
                AscendC::Compare(mask, tmp, need, AscendC::CMPMODE::LT, n);
                AscendC::Adds(tmp, pos, (float)(step * sizeof(float)), n);
                AscendC::Select(pos, mask, tmp, pos, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
            }
            AscendC::Cast(off, pos, AscendC::RoundMode::CAST_RINT, n);
            AscendC::Gather(need, levels, off.ReinterpretCast<uint32_t>(), 0, n);
        }
        AscendC::Cast(stats, need, AscendC::RoundMode::CAST_RINT, nstat);
        AscendC::Cast(sig, stats, AscendC::RoundMode::CAST_NONE, nstat);
    }

    // Channel-axis chunks (c rows of one column): folds each chunk of w with op and gathers the
    // chunk rows into out as [num_chunks, D].
    __aicore__ inline void ChannelChunks(Op op, const AscendC::LocalTensor<float>& w,
                                         const AscendC::LocalTensor<float>& out, uint32_t rows, uint32_t c)
    {
        const uint32_t d = t_->headDim;
        for (uint32_t k = 0; k * c < rows; ++k) {
            FoldRows(op, w[k * c * d], Min(c, rows - k * c), d);
            AscendC::DataCopy(out[k * d], w[k * c * d], d);
        }
    }

    // xf (n values, n % 64 == 0) of K (kv 0) or V -> packed anchor and residual codes, with the
    // tensor's thresholds and end-cell split thresholds (+inf where a code is not split).
    __aicore__ inline void Quantize(uint32_t kv, const AscendC::LocalTensor<float>& xf, uint32_t n,
                                    const AscendC::LocalTensor<uint8_t>& codes, const AscendC::LocalTensor<uint8_t>& res,
                                    const AscendC::LocalTensor<float>& thr, const AscendC::LocalTensor<float>& split)
    {
        AscendC::LocalTensor<float> ax = f1Buf_.Get<float>();
        AscendC::LocalTensor<float> idx = f2Buf_.Get<float>();
        AscendC::LocalTensor<float> tmp = f3Buf_.Get<float>();
        AscendC::LocalTensor<int32_t> off = offBuf_.Get<int32_t>();
        AscendC::LocalTensor<uint8_t> mask = maskBuf_.Get<uint8_t>();
        AscendC::Abs(ax, xf, n);
        // I = #{j : thr[j] <= |x|}: thresholds increase, so binary-search the largest I with
        // thr[I - 1] <= |x| over the table padded with +inf to a power of two
        AscendC::Duplicate(idx, 0.0f, n);
        for (uint32_t step = t_->tableSize / 2; step >= 1; step /= 2) {
            AscendC::Adds(tmp, idx, (float)(step - 1), n);
            AscendC::Muls(tmp, tmp, (float)sizeof(float), n);   // byte offset of thr[idx + step - 1]
            AscendC::Cast(off, tmp, AscendC::RoundMode::CAST_RINT, n);
            AscendC::Gather(tmp, thr, off.ReinterpretCast<uint32_t>(), 0, n);
            AscendC::Compare(mask, tmp, ax, AscendC::CMPMODE::LE, n);
            AscendC::Adds(tmp, idx, (float)step, n);
            AscendC::Select(idx, mask, tmp, idx, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
        }
        // the end cells' half code: h = |x| >= split[I] (I <= y_max < 128: inside the table), kept
        // as E = 2 I - 1 + h (exact small integers; |x| is not needed past here, so ax holds E)
        AscendC::Muls(tmp, idx, (float)sizeof(float), n);       // byte offset of split[I]
        AscendC::Cast(off, tmp, AscendC::RoundMode::CAST_RINT, n);
        AscendC::Gather(tmp, split, off.ReinterpretCast<uint32_t>(), 0, n);
        AscendC::Compare(mask, ax, tmp, AscendC::CMPMODE::GE, n);   // mask = h
        AscendC::Muls(ax, idx, 2.0f, n);
        AscendC::Adds(tmp, ax, -1.0f, n);
        AscendC::Select(ax, mask, ax, tmp, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);  // ax = E
        // m = (I + bias) >> r (exact in float32: small integers times a power of two)
        const uint32_t a = t_->anchorBits[kv], r = t_->residualBits[kv];
        const float one = (float)(1u << r);
        AscendC::Adds(tmp, idx, (float)t_->bias[kv], n);
        AscendC::Muls(tmp, tmp, 1.0f / one, n);
        AscendC::Cast(off, tmp, AscendC::RoundMode::CAST_FLOOR, n);
        AscendC::Cast(tmp, off, AscendC::RoundMode::CAST_NONE, n);
        AscendC::Muls(tmp, tmp, one, n);                                 // tmp = M = m << r
        AscendC::Sub(idx, tmp, idx, n);                                  // idx = d = M - I (middle cells)
        AscendC::Sub(ax, tmp, ax, n);
        AscendC::Add(ax, ax, tmp, n);                                    // ax = 2 M - E = 2 d + 1 - h
        // field: 2 d + 1 - h in the end cells m == 0 (M == 0) and m == top (M == y_max), else d
        AscendC::CompareScalar(mask, tmp, 0.0f, AscendC::CMPMODE::EQ, n);
        AscendC::Select(idx, mask, ax, idx, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
        AscendC::CompareScalar(mask, tmp, (float)t_->yMax[kv], AscendC::CMPMODE::EQ, n);
        AscendC::Select(ax, mask, ax, idx, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);  // ax = field
        AscendC::Muls(tmp, tmp, 1.0f / one, n);                          // tmp = m (exact)
        // anchor code: m, or (-m - 1) & (2^a - 1) = 2^a - 1 - m where the centred value is negative
        const float anchorMask = (float)((1u << a) - 1);
        AscendC::CompareScalar(mask, xf, 0.0f, AscendC::CMPMODE::LT, n);
        AscendC::Muls(idx, tmp, -1.0f, n);
        AscendC::Adds(idx, idx, anchorMask, n);
        AscendC::Select(idx, mask, idx, tmp, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
        // residual code: field & (2^r - 1) (field in [-2^r + 1, 2^r - 1]: cell 0's end fields
        // are <= 0, the top cell's >= 0, a middle cell's in [-2^(r-1), 2^(r-1) - 1])
        AscendC::CompareScalar(mask, ax, 0.0f, AscendC::CMPMODE::LT, n);
        AscendC::Adds(tmp, ax, one, n);
        AscendC::Select(ax, mask, tmp, ax, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
        // 4-bit streams (the default split) take the nibble packer: fewer vector instructions
        if (a == 4) PackNibbles(codes, idx, n); else Pack(codes, idx, n, a, 2 * kv);
        if (r == 4) PackNibbles(res, ax, n); else Pack(res, ax, n, r, 2 * kv + 1);
    }

    // Two 4-bit values per byte, low nibble first: GatherMask splits even / odd lanes,
    // byte = even + 16 * odd, then float -> half -> uint8 (exact for 0..255).
    __aicore__ inline void PackNibbles(const AscendC::LocalTensor<uint8_t>& dst, const AscendC::LocalTensor<float>& nib,
                                       uint32_t n)
    {
        AscendC::LocalTensor<float> tmp = f3Buf_.Get<float>();
        AscendC::LocalTensor<half> h = offBuf_.Get<half>();
        const AscendC::GatherMaskParams p(1, (uint16_t)(n / REPEAT_FLOATS), 8, 0);
        uint64_t kept = 0;
        AscendC::GatherMask(tmp, nib, 1, false, 0, p, kept);            // even lanes
        AscendC::GatherMask(tmp[n / 2], nib, 2, false, 0, p, kept);     // odd lanes
        AscendC::Muls(tmp[n / 2], tmp[n / 2], 16.0f, n / 2);
        AscendC::Add(tmp, tmp, tmp[n / 2], n / 2);
        AscendC::Cast(h, tmp, AscendC::RoundMode::CAST_NONE, n / 2);
        AscendC::Cast(dst, h, AscendC::RoundMode::CAST_NONE, n / 2);
    }

    // v: n codes of b bits (integers in float, n % 64 == 0; clobbered) of code stream st ->
    // n * b / 8 packed bytes, without bit instructions. A group lane u puts w = v << shift (exact,
    // < 2^15) into its byte as lo = w mod 256 and into the next as hi = floor(w / 256) (0 unless
    // it spills), so byte j of a group sums lo of the lanes starting in j and hi of those starting
    // in j - 1: two Selects by lane masks and an 8-lane WholeReduceSum per j give every group's
    // byte j (j-major, in the work buffer), and a Gather interleaves them into stream order.
    __aicore__ inline void Pack(const AscendC::LocalTensor<uint8_t>& dst, const AscendC::LocalTensor<float>& v,
                                uint32_t n, uint32_t b, uint32_t st)
    {
        AscendC::LocalTensor<float> hi = f3Buf_.Get<float>();
        AscendC::LocalTensor<float> sel = offBuf_.Get<float>();
        AscendC::LocalTensor<int32_t> ints = offBuf_.Get<int32_t>();
        AscendC::LocalTensor<float> bytes = workBuf_.Get<float>();  // [b, groups]: free once stats are out
        AscendC::LocalTensor<uint8_t> mask = maskBuf_.Get<uint8_t>();
        const uint32_t groups = n / BLOCK_FLOATS, count = groups * b;
        PatternOp(Op::MUL, v, v, shiftBuf_.Get<float>()[st * BLOCK_FLOATS], n);
        AscendC::Muls(hi, v, 1.0f / 256, n);
        AscendC::Cast(ints, hi, AscendC::RoundMode::CAST_FLOOR, n);
        AscendC::Cast(hi, ints, AscendC::RoundMode::CAST_NONE, n);
        AscendC::Muls(sel, hi, 256.0f, n);
        AscendC::Sub(v, v, sel, n);                                       // v = lo
        for (uint32_t j = 0; j < b; ++j) {
            uint16_t lo = 0, keep = 0;  // lane bits of a group (one mask byte), doubled for uint16
            for (uint32_t u = 0; u < BLOCK_FLOATS; ++u) {
                if (LaneByte(b, u) == j) lo |= (uint16_t)(0x101u << u);
                if (LaneByte(b, u) == j || LaneByte(b, u) + 1 == j) keep |= (uint16_t)(0x101u << u);
            }
            AscendC::Duplicate(mask.ReinterpretCast<uint16_t>(), lo, n / 16);
            AscendC::Select(sel, mask, v, hi, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
            AscendC::Duplicate(mask.ReinterpretCast<uint16_t>(), keep, n / 16);
            AscendC::Select(sel, mask, sel, 0.0f, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
            for (uint32_t g0 = 0; g0 < groups; g0 += REDUCE_STEP)  // exact: integer sums < 256
                AscendC::WholeReduceSum(bytes[j * groups + g0], sel[g0 * BLOCK_FLOATS], (int32_t)BLOCK_FLOATS,
                                        (int32_t)Min(REDUCE_STEP, groups - g0), 1, 1, 1);
        }
        // stream byte p = g * b + j <- bytes[j * groups + g]; g = floor((p + 0.5) / b) is exact
        // (p < 2^11), and so is the byte offset 4 * (p * groups + g * (1 - b * groups)) (terms < 2^24)
        AscendC::CreateVecIndex(hi, 0.0f, count);
        AscendC::Adds(v, hi, 0.5f, count);
        AscendC::Muls(v, v, 1.0f / b, count);
        AscendC::Cast(ints, v, AscendC::RoundMode::CAST_FLOOR, count);
        AscendC::Cast(v, ints, AscendC::RoundMode::CAST_NONE, count);
        AscendC::Muls(hi, hi, 4.0f * groups, count);
        AscendC::Muls(v, v, 4.0f * (1.0f - (float)(b * groups)), count);
        AscendC::Add(hi, hi, v, count);
        AscendC::Cast(ints, hi, AscendC::RoundMode::CAST_RINT, count);
        AscendC::Gather(v, bytes, ints.ReinterpretCast<uint32_t>(), 0, count);
        AscendC::LocalTensor<half> h = f3Buf_.Get<half>();
        AscendC::Cast(h, v, AscendC::RoundMode::CAST_NONE, count);       // exact for 0..255
        AscendC::Cast(dst, h, AscendC::RoundMode::CAST_NONE, count);
    }

    __aicore__ inline void CopyOut(uint32_t kv, uint32_t h, const LynxPageKind& pk, uint64_t aBase, uint64_t rBase,
                                   uint32_t r0, uint32_t rows, uint32_t nstat)
    {
        const uint32_t d = t_->headDim, c = t_->chunkSize[kv], tp = pk.numTokens;
        const uint32_t a = t_->anchorBits[kv], r = t_->residualBits[kv];
        // first value of the block in [H, Tp, D]; a multiple of 16 (D is), so its codes start on a byte
        const uint64_t first = ((uint64_t)h * tp + r0) * d;
        AscendC::LocalTensor<uint8_t> codes = codeQueue_.DeQue<uint8_t>();
        AscendC::DataCopyPad(anchorGm_[aBase + pk.offset[LYNX_K_CODES + kv] + first * a / 8], codes,
                             AscendC::DataCopyExtParams(1, rows * d * a / 8, 0, 0, 0));
        codeQueue_.FreeTensor(codes);
        AscendC::LocalTensor<uint8_t> res = resQueue_.DeQue<uint8_t>();
        AscendC::DataCopyPad(residualGm_[rBase + pk.offset[LYNX_K_RES + kv] + first * r / 8], res,
                             AscendC::DataCopyExtParams(1, rows * d * r / 8, 0, 0, 0));
        resQueue_.FreeTensor(res);

        const uint64_t chunk0 = t_->axis[kv] == LYNX_AXIS_CHANNEL
                                    ? ((uint64_t)h * CeilDiv(tp, c) + r0 / c) * d
                                    : ((uint64_t)h * tp + r0) * (d / t_->tokenChunk[kv]);
        AscendC::GlobalTensor<half> statsGm;
        statsGm.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(anchor_ + aBase + pk.offset[LYNX_K_STATS + kv]),
                                2ull * pk.numChunks[kv]);
        const AscendC::DataCopyExtParams statParams(1, nstat * sizeof(half), 0, 0, 0);
        AscendC::LocalTensor<half> stats = statsQueue_.DeQue<half>();
        AscendC::DataCopyPad(statsGm[chunk0], stats, statParams);                               // mu
        AscendC::DataCopyPad(statsGm[pk.numChunks[kv] + chunk0], stats[t_->maxStats], statParams);  // sigma
        statsQueue_.FreeTensor(stats);
    }

    const LynxTiling* t_ = nullptr;
    GM_ADDR anchor_ = nullptr;
    GM_ADDR residual_ = nullptr;
    AscendC::GlobalTensor<T> kvGm_[2];
    AscendC::GlobalTensor<float> thrGm_[2];
    AscendC::GlobalTensor<float> splitGm_[2];  // the end cells' split thresholds of K, V
    AscendC::GlobalTensor<float> sigGm_;  // byte grid: the 256 sigma levels
    bool byteGrid_ = false;               // tiling scalarGrid == LYNX_GRID_BYTE
    AscendC::GlobalTensor<uint8_t> anchorGm_, residualGm_;
    // [2, tableSize] thresholds of K then V, [2, tableSize] split thresholds of K then V
    // (+ [sigmaTableSize] sigma levels on the byte grid), whole kernel
    AscendC::LocalTensor<float> tables_;

    AscendC::TQue<AscendC::TPosition::VECIN, 1> tableQueue_;
    AscendC::TQueBind<AscendC::TPosition::VECIN, AscendC::TPosition::VECOUT, BUFFER_NUM> sinkQueue_;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> inQueue_;     // KV rows, dtype
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> codeQueue_;  // packed anchor codes
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> resQueue_;   // packed residual codes
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> statsQueue_; // mu | sigma, float16
    AscendC::TQue<AscendC::TPosition::VECOUT, 1> gammaQueue_;          // page min | max, dtype
    AscendC::TBuf<AscendC::TPosition::VECCALC> xBuf_, workBuf_;        // [blockElems] float32
    // [maxStats]: chunk sums and counts (mean) or maxima and minima (midrange), mu, sigma
    AscendC::TBuf<AscendC::TPosition::VECCALC> sumBuf_, cntBuf_, muBuf_, sigBuf_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> spreadBuf_;             // [maxStats * 8] Brcb blocks
    AscendC::TBuf<AscendC::TPosition::VECCALC> gminBuf_, gmaxBuf_, invScaleBuf_;      // [dimPad]
    AscendC::TBuf<AscendC::TPosition::VECCALC> rowMaskBuf_;            // [dimPad] bits
    AscendC::TBuf<AscendC::TPosition::VECCALC> f1Buf_, f2Buf_, f3Buf_, offBuf_;    // [subBlock]
    AscendC::TBuf<AscendC::TPosition::VECCALC> maskBuf_;               // [subBlock] bits
    AscendC::TBuf<AscendC::TPosition::VECCALC> sigMaskBuf_;            // [maxStats] bits: sigma > 0, sigma search
    AscendC::TBuf<AscendC::TPosition::VECCALC> shiftBuf_;              // [code streams] blocks: 2^shift
};

}  // namespace lynx

#define LYNX_COMPRESS_ENTRY(NAME, TYPE)                                                                  \
    extern "C" __global__ __aicore__ void NAME(GM_ADDR k, GM_ADDR v, GM_ADDR kThr, GM_ADDR vThr,        \
                                               GM_ADDR kSplit, GM_ADDR vSplit, GM_ADDR sigLevels,       \
                                               GM_ADDR anchor, GM_ADDR residual, GM_ADDR tiling)        \
    {                                                                                                    \
        LynxTiling t;                                                                                    \
        lynx::CopyTiling(&t, tiling);                                                                    \
        AscendC::TPipe pipe;                                                                             \
        lynx::LynxCompress<TYPE> op;                                                                     \
        op.Init(k, v, kThr, vThr, kSplit, vSplit, sigLevels, anchor, residual, &t, &pipe);               \
        op.Process();                                                                                    \
    }

LYNX_COMPRESS_ENTRY(lynx_compress_fp16, half)
LYNX_COMPRESS_ENTRY(lynx_compress_bf16, bfloat16_t)
