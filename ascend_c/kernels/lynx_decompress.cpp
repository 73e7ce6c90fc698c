/*
 * Lynx decompress kernel (Ascend C, AI Vector cores): every page's anchor buffer (and, for the
 * full stage, residual buffer) -> K, V of one layer, either dense [H, T, D] or written straight
 * into vLLM-Ascend's paged caches (separate K and V of [num_blocks, block_size, H, D], token t
 * at slot_mapping[t]). The math is lynx_ref.dequantize, float32 in the same order:
 *
 *   j  = m << r (anchor stage)  or  (m << r) | f (full stage; f = the unsigned r-bit residual
 *        field, so (m << r) | f = (m << r) + f: exact small integers, no clamp: j < 128)
 *   xf = +-magnitudes[j]        (sign from the anchor code; lynx_tables.magnitudes, payload format
 *                                8's end cells included, is an input: no exp here)
 *   x  = ((xf * sigma + mu) * (gmax - gmin) + gmin) -> KV dtype (round to nearest even)
 *
 * Codes (a anchor bits and r = 8 - a residual bits, each of K and V its own a) are unpacked
 * without bit instructions: bytes go through Cast to float, two Gathers bring each value the
 * byte it starts in and the next one, and floor divisions by powers of two cut its bits out.
 * 4-bit streams (the default) take the nibble path: one Gather duplicates byte j into lanes 2j
 * and 2j+1, and a Select takes hi = floor(b / 16) on odd lanes, lo = b - 16 * hi on even ones.
 *
 * Pipeline per work item (page, K|V, head) and row block:
 *   CopyIn (MTE2: codes, residual, mu | sigma -> queues) -> Compute (V) -> CopyOut (MTE3).
 */
#include "lynx_kernel_common.h"

namespace lynx {

template <typename T>
class LynxDecompress {
public:
    __aicore__ inline LynxDecompress() {}

    __aicore__ inline void Init(GM_ADDR anchor, GM_ADDR residual, GM_ADDR kMags, GM_ADDR vMags, GM_ADDR kOut,
                                GM_ADDR vOut, GM_ADDR slotMapping, const LynxTiling* tiling, AscendC::TPipe* pipe)
    {
        t_ = tiling;
        anchor_ = anchor;
        paged_ = t_->mode == LYNX_MODE_DECOMPRESS_PAGED;
        const uint64_t out = paged_ ? t_->numSlots * t_->numHeads * t_->headDim
                                    : (uint64_t)t_->numHeads * t_->numTokens * t_->headDim;
        outGm_[0].SetGlobalBuffer(reinterpret_cast<__gm__ T*>(kOut), out);
        outGm_[1].SetGlobalBuffer(reinterpret_cast<__gm__ T*>(vOut), out);
        magGm_[0].SetGlobalBuffer(reinterpret_cast<__gm__ float*>(kMags), t_->tableSize);
        magGm_[1].SetGlobalBuffer(reinterpret_cast<__gm__ float*>(vMags), t_->tableSize);
        anchorGm_.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(anchor), t_->anchorTotal);
        if (t_->useResidual)
            residualGm_.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(residual), t_->residualTotal);
        if (paged_) {
            slot32Gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(slotMapping), t_->numTokens);
            slot64Gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(slotMapping), t_->numTokens);
        }

        const uint32_t d = t_->headDim, es = sizeof(T), np = t_->blockElems, sb = t_->subBlock;
        const uint32_t stats = t_->maxStats;
        pipe->InitBuffer(tableQueue_, 1, LYNX_DECOMPRESS_TABLES * t_->tableSize * sizeof(float));
        if (t_->numSink) pipe->InitBuffer(sinkQueue_, BUFFER_NUM, t_->sinkRows * d * es);
        pipe->InitBuffer(codeQueue_, BUFFER_NUM, LynxCodeBytes(*t_, np, false));
        if (t_->useResidual) pipe->InitBuffer(resQueue_, BUFFER_NUM, LynxCodeBytes(*t_, np, true));
        pipe->InitBuffer(statsQueue_, BUFFER_NUM, stats * 2 * sizeof(half));
        pipe->InitBuffer(gammaQueue_, 1, 2 * d * es);
        pipe->InitBuffer(outQueue_, BUFFER_NUM, t_->maxBlockRows * d * es);
        pipe->InitBuffer(xBuf_, np * sizeof(float));
        pipe->InitBuffer(muBuf_, stats * sizeof(float));
        pipe->InitBuffer(sigBuf_, stats * sizeof(float));
        if (t_->axis[0] == LYNX_AXIS_TOKEN || t_->axis[1] == LYNX_AXIS_TOKEN)
            pipe->InitBuffer(spreadBuf_, stats * BLOCK_FLOATS * sizeof(float));
        pipe->InitBuffer(gminBuf_, t_->dimPad * sizeof(float));
        pipe->InitBuffer(scaleBuf_, t_->dimPad * sizeof(float));
        pipe->InitBuffer(f1Buf_, sb * sizeof(float));
        pipe->InitBuffer(f2Buf_, sb * sizeof(float));
        pipe->InitBuffer(f3Buf_, sb * sizeof(float));
        pipe->InitBuffer(f4Buf_, sb * sizeof(float));
        pipe->InitBuffer(offBuf_, sb * sizeof(int32_t));
        pipe->InitBuffer(halfBuf_, sb * sizeof(half));
        pipe->InitBuffer(groupBuf_, sb * sizeof(float));
        pipe->InitBuffer(negBuf_, sb / 8);
        pipe->InitBuffer(oddMaskBuf_, sb / 8);
        pipe->InitBuffer(laneBuf_, LYNX_CODE_STREAMS * LYNX_UNPACK_PATTERNS * LYNX_ALIGN);
    }

    __aicore__ inline void Process()
    {
        AscendC::LocalTensor<float> tables = tableQueue_.AllocTensor<float>();
        AscendC::DataCopy(tables, magGm_[0], t_->tableSize);
        AscendC::DataCopy(tables[t_->tableSize], magGm_[1], t_->tableSize);
        tableQueue_.EnQue(tables);
        tables_ = tableQueue_.DeQue<float>();
        BuildUnpackConstants();

        const uint32_t blocks = (uint32_t)AscendC::GetBlockNum();
        const uint32_t per = CeilDiv(t_->numWork, blocks);
        const uint32_t begin = (uint32_t)AscendC::GetBlockIdx() * per;
        const uint32_t end = Min(t_->numWork, begin + per);
        for (uint32_t item = begin; item < end; ++item) ProcessItem(item);

        tableQueue_.FreeTensor(tables_);
    }

private:
    // group[i] = 4 * floor(i / 8): value i's 8-value group, times the 4 bytes of a float (times
    // b, the group's first byte offset among b-bit codes cast to float). Per code stream
    // (K anchor, K residual, V anchor, V residual) and group lane u, three blocks: 4 * the byte
    // it starts in, 4 * whether it spills into the next, 2^-shift.
    __aicore__ inline void BuildUnpackConstants()
    {
        const uint32_t sb = t_->subBlock;
        AscendC::LocalTensor<float> group = groupBuf_.Get<float>();
        AscendC::LocalTensor<int32_t> ints = offBuf_.Get<int32_t>();
        allNibbles_ = true;
        for (uint32_t kv = 0; kv < 2; ++kv)
            if (t_->anchorBits[kv] != 4 || t_->residualBits[kv] != 4) allNibbles_ = false;
        if (allNibbles_) {  // no generic stream: groupBuf_ holds dup[i] = 4 * floor(i / 2) instead
            AscendC::LocalTensor<float> f = f1Buf_.Get<float>();
            AscendC::LocalTensor<int32_t> dup = groupBuf_.Get<int32_t>();
            AscendC::CreateVecIndex(f, 0.0f, sb);
            AscendC::Muls(f, f, 0.5f, sb);
            AscendC::Cast(dup, f, AscendC::RoundMode::CAST_FLOOR, sb);
            AscendC::Cast(f, dup, AscendC::RoundMode::CAST_NONE, sb);
            AscendC::Muls(f, f, (float)sizeof(float), sb);
            AscendC::Cast(dup, f, AscendC::RoundMode::CAST_RINT, sb);
        } else {
            AscendC::CreateVecIndex(group, 0.0f, sb);
            AscendC::Muls(group, group, 1.0f / BLOCK_FLOATS, sb);
            AscendC::Cast(ints, group, AscendC::RoundMode::CAST_FLOOR, sb);
            AscendC::Cast(group, ints, AscendC::RoundMode::CAST_NONE, sb);
            AscendC::Muls(group, group, (float)sizeof(float), sb);
        }
        for (uint32_t st = 0; st < LYNX_CODE_STREAMS; ++st) {
            const uint32_t b = st % 2 ? t_->residualBits[st / 2] : t_->anchorBits[st / 2];
            float first[BLOCK_FLOATS], spill[BLOCK_FLOATS], shift[BLOCK_FLOATS];
            for (uint32_t u = 0; u < BLOCK_FLOATS; ++u) {
                first[u] = (float)(sizeof(float) * LaneByte(b, u));
                spill[u] = (float)(sizeof(float) * LaneSpills(b, u));
                shift[u] = 1.0f / (float)(1u << LaneShift(b, u));
            }
            SetLanes(Lanes(st, 0), first);
            SetLanes(Lanes(st, 1), spill);
            SetLanes(Lanes(st, 2), shift);
        }
    }

    // Pattern block `which` of code stream st (BuildUnpackConstants).
    __aicore__ inline AscendC::LocalTensor<float> Lanes(uint32_t st, uint32_t which)
    {
        return laneBuf_.Get<float>()[(st * LYNX_UNPACK_PATTERNS + which) * BLOCK_FLOATS];
    }

    __aicore__ inline void ProcessItem(uint32_t item)
    {
        const uint32_t h = item % t_->numHeads;
        const uint32_t kv = (item / t_->numHeads) % 2;
        const uint32_t page = item / (2 * t_->numHeads);
        const LynxPageKind& pk = t_->kind[LynxKindOf(*t_, page)];
        const uint64_t aBase = LynxAnchorBase(*t_, page);
        const uint64_t rBase = LynxResidualBase(*t_, page);
        if (pk.numSink) CopySinks(kv, h, aBase + pk.offset[LYNX_K_SINK + kv]);
        if (pk.numTokens == 0) return;

        LoadGamma(kv, h, aBase + pk.offset[LYNX_K_GAMMA + kv]);
        const uint32_t rowsPer = t_->rowsPerBlock[kv], body = LynxBodyStart(*t_, page);
        for (uint32_t r0 = 0; r0 < pk.numTokens; r0 += rowsPer) {
            const uint32_t rows = Min(rowsPer, pk.numTokens - r0);
            const uint32_t nstat = CopyIn(kv, h, pk, aBase, rBase, r0, rows);
            Compute(kv, rows, nstat);
            CopyOut(kv, h, body + r0, rows);
        }
    }

    __aicore__ inline void LoadGamma(uint32_t kv, uint32_t h, uint64_t srcByte)
    {
        const uint32_t d = t_->headDim;
        AscendC::GlobalTensor<T> src;
        src.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(anchor_ + srcByte), 2ull * t_->numHeads * d);
        AscendC::LocalTensor<T> g = gammaQueue_.AllocTensor<T>();
        AscendC::DataCopy(g, src[(uint64_t)h * d], d);
        AscendC::DataCopy(g[d], src[((uint64_t)t_->numHeads + h) * d], d);
        gammaQueue_.EnQue(g);
        g = gammaQueue_.DeQue<T>();
        AscendC::LocalTensor<float> gmin = gminBuf_.Get<float>();
        AscendC::LocalTensor<float> scale = scaleBuf_.Get<float>();
        AscendC::Cast(gmin, g, AscendC::RoundMode::CAST_NONE, d);
        AscendC::Cast(scale, g[d], AscendC::RoundMode::CAST_NONE, d);
        AscendC::Sub(scale, scale, gmin, d);  // gmax - gmin
        gammaQueue_.FreeTensor(g);
    }

    // Returns the number of chunk statistics of the block.
    __aicore__ inline uint32_t CopyIn(uint32_t kv, uint32_t h, const LynxPageKind& pk, uint64_t aBase, uint64_t rBase,
                                      uint32_t r0, uint32_t rows)
    {
        const uint32_t d = t_->headDim, c = t_->chunkSize[kv], tc = t_->tokenChunk[kv], tp = pk.numTokens;
        const uint32_t a = t_->anchorBits[kv], r = t_->residualBits[kv];
        const uint64_t first = ((uint64_t)h * tp + r0) * d;  // % 16 == 0: its codes start on a byte
        const AscendC::DataCopyPadExtParams<uint8_t> noPad(false, 0, 0, 0);
        AscendC::LocalTensor<uint8_t> codes = codeQueue_.AllocTensor<uint8_t>();
        AscendC::DataCopyPad(codes, anchorGm_[aBase + pk.offset[LYNX_K_CODES + kv] + first * a / 8],
                             AscendC::DataCopyExtParams(1, rows * d * a / 8, 0, 0, 0), noPad);
        codeQueue_.EnQue(codes);
        if (t_->useResidual) {
            AscendC::LocalTensor<uint8_t> res = resQueue_.AllocTensor<uint8_t>();
            AscendC::DataCopyPad(res, residualGm_[rBase + pk.offset[LYNX_K_RES + kv] + first * r / 8],
                                 AscendC::DataCopyExtParams(1, rows * d * r / 8, 0, 0, 0), noPad);
            resQueue_.EnQue(res);
        }
        const bool channel = t_->axis[kv] == LYNX_AXIS_CHANNEL;
        const uint32_t nstat = channel ? CeilDiv(rows, c) * d : rows * (d / tc);
        const uint64_t chunk0 = channel ? ((uint64_t)h * CeilDiv(tp, c) + r0 / c) * d : ((uint64_t)h * tp + r0) * (d / tc);
        AscendC::GlobalTensor<half> statsGm;
        statsGm.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(anchor_ + aBase + pk.offset[LYNX_K_STATS + kv]),
                                2ull * pk.numChunks[kv]);
        const AscendC::DataCopyExtParams statParams(1, nstat * sizeof(half), 0, 0, 0);
        const AscendC::DataCopyPadExtParams<half> halfPad(false, 0, 0, (half)0);
        AscendC::LocalTensor<half> stats = statsQueue_.AllocTensor<half>();
        AscendC::DataCopyPad(stats, statsGm[chunk0], statParams, halfPad);                              // mu
        AscendC::DataCopyPad(stats[t_->maxStats], statsGm[pk.numChunks[kv] + chunk0], statParams, halfPad);  // sigma
        statsQueue_.EnQue(stats);
        return nstat;
    }

    __aicore__ inline void Compute(uint32_t kv, uint32_t rows, uint32_t nstat)
    {
        const uint32_t d = t_->headDim, c = t_->chunkSize[kv], n = rows * d;
        const uint32_t np = LynxRoundUp(n, REPEAT_FLOATS);
        AscendC::LocalTensor<float> x = xBuf_.Get<float>();
        AscendC::LocalTensor<uint8_t> codes = codeQueue_.DeQue<uint8_t>();
        AscendC::LocalTensor<uint8_t> res;
        if (t_->useResidual) res = resQueue_.DeQue<uint8_t>();
        const AscendC::LocalTensor<float> mags = tables_[kv * t_->tableSize];
        const uint32_t a = t_->anchorBits[kv], r = t_->residualBits[kv];
        for (uint32_t s = 0; s < np; s += t_->subBlock) {  // codes 32-byte aligned as in compress
            const uint32_t m = Min(t_->subBlock, np - s);
            Dequantize(kv, codes[s * a / 8], t_->useResidual ? res[s * r / 8] : res, m, mags, x[s]);
        }
        codeQueue_.FreeTensor(codes);
        if (t_->useResidual) resQueue_.FreeTensor(res);

        AscendC::LocalTensor<half> stats = statsQueue_.DeQue<half>();
        AscendC::LocalTensor<float> mu = muBuf_.Get<float>();
        AscendC::LocalTensor<float> sig = sigBuf_.Get<float>();
        AscendC::Cast(mu, stats, AscendC::RoundMode::CAST_NONE, nstat);
        AscendC::Cast(sig, stats[t_->maxStats], AscendC::RoundMode::CAST_NONE, nstat);
        statsQueue_.FreeTensor(stats);
        if (t_->axis[kv] == LYNX_AXIS_CHANNEL) {
            for (uint32_t k = 0; k * c < rows; ++k) {
                const uint32_t rk = Min(c, rows - k * c);
                RowBroadcast(Op::MUL, x[k * c * d], x[k * c * d], sig[k * d], rk, d);
                RowBroadcast(Op::ADD, x[k * c * d], x[k * c * d], mu[k * d], rk, d);
            }
        } else {
            AscendC::LocalTensor<float> spread = spreadBuf_.Get<float>();
            ChunkBroadcast(Op::MUL, x, x, sig, spread, nstat, t_->tokenChunk[kv]);
            ChunkBroadcast(Op::ADD, x, x, mu, spread, nstat, t_->tokenChunk[kv]);
        }
        RowBroadcast(Op::MUL, x, x, scaleBuf_.Get<float>(), rows, d);
        RowBroadcast(Op::ADD, x, x, gminBuf_.Get<float>(), rows, d);

        AscendC::LocalTensor<T> out = outQueue_.AllocTensor<T>();
        SaturateToKv(out, x, n);
        outQueue_.EnQue(out);
    }

    // m packed codes of K (kv 0) or V (m * a / 8, m * r / 8 bytes) -> xf = +-magnitudes[j] for m
    // lanes (m % 64 == 0), j = (anchor magnitude << r) | residual field.
    __aicore__ inline void Dequantize(uint32_t kv, const AscendC::LocalTensor<uint8_t>& codes,
                                      const AscendC::LocalTensor<uint8_t>& res, uint32_t m,
                                      const AscendC::LocalTensor<float>& mags, const AscendC::LocalTensor<float>& xf)
    {
        AscendC::LocalTensor<float> raw = f1Buf_.Get<float>();
        AscendC::LocalTensor<float> code = f2Buf_.Get<float>();
        AscendC::LocalTensor<float> tmp = f3Buf_.Get<float>();
        AscendC::LocalTensor<uint8_t> neg = negBuf_.Get<uint8_t>();
        const uint32_t a = t_->anchorBits[kv], r = t_->residualBits[kv];
        const float one = (float)(1u << r);
        const float anchorMask = (float)((1u << a) - 1);
        // anchor code c: negative (sign bit set) -> m = 2^a - 1 - c, else m = c
        Unpack(codes, m, a, 2 * kv);
        AscendC::CompareScalar(neg, raw, (anchorMask + 1) / 2, AscendC::CMPMODE::GE, m);
        AscendC::Muls(code, raw, -1.0f, m);
        AscendC::Adds(code, code, anchorMask, m);
        AscendC::Select(code, neg, code, raw, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, m);
        AscendC::Muls(code, code, one, m);  // j = m << r: field 0, the anchor's level
        if (t_->useResidual) {              // j = (m << r) | f = (m << r) + f, f the unsigned r-bit field
            Unpack(res, m, r, 2 * kv + 1);
            AscendC::Add(code, code, raw, m);
        }
        AscendC::Muls(code, code, (float)sizeof(float), m);
        AscendC::LocalTensor<int32_t> off = offBuf_.Get<int32_t>();
        AscendC::Cast(off, code, AscendC::RoundMode::CAST_RINT, m);
        AscendC::Gather(raw, mags, off.ReinterpretCast<uint32_t>(), 0, m);  // |x| = magnitudes[j]
        AscendC::Muls(tmp, raw, -1.0f, m);
        AscendC::Select(xf, neg, tmp, raw, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, m);
    }

    // m * b / 8 packed bytes of code stream st -> m codes of b bits in f1 as float. Value i
    // takes w = b0 + 256 * b1, b0 the byte it starts in, b1 the next one where it spills (else b0
    // again: its bits are cut off), then (w >> shift) mod 2^b by floor divisions (exact: w < 2^16).
    __aicore__ inline void Unpack(const AscendC::LocalTensor<uint8_t>& bytes, uint32_t m, uint32_t b, uint32_t st)
    {
        if (b == 4) {  // 4-bit streams (the default split): the nibble path, fewer vector instructions
            UnpackNibbles(bytes, m, st);
            return;
        }
        AscendC::LocalTensor<float> v = f1Buf_.Get<float>();
        AscendC::LocalTensor<float> byteF = f3Buf_.Get<float>();
        AscendC::LocalTensor<float> tmp = f4Buf_.Get<float>();
        AscendC::LocalTensor<half> h = halfBuf_.Get<half>();
        AscendC::LocalTensor<int32_t> off = offBuf_.Get<int32_t>();
        AscendC::Cast(h, bytes, AscendC::RoundMode::CAST_NONE, m * b / 8);
        AscendC::Cast(byteF, h, AscendC::RoundMode::CAST_NONE, m * b / 8);
        AscendC::Muls(tmp, groupBuf_.Get<float>(), (float)b, m);        // byte offset of the group
        PatternOp(Op::ADD, tmp, tmp, Lanes(st, 0), m);
        AscendC::Cast(off, tmp, AscendC::RoundMode::CAST_RINT, m);
        AscendC::Gather(v, byteF, off.ReinterpretCast<uint32_t>(), 0, m);  // the byte it starts in
        PatternOp(Op::ADD, tmp, tmp, Lanes(st, 1), m);
        AscendC::Cast(off, tmp, AscendC::RoundMode::CAST_RINT, m);
        AscendC::Gather(tmp, byteF, off.ReinterpretCast<uint32_t>(), 0, m);
        AscendC::Muls(tmp, tmp, 256.0f, m);
        AscendC::Add(v, v, tmp, m);                                     // w
        PatternOp(Op::MUL, v, v, Lanes(st, 2), m);
        AscendC::Cast(off, v, AscendC::RoundMode::CAST_FLOOR, m);
        AscendC::Cast(v, off, AscendC::RoundMode::CAST_NONE, m);        // w >> shift
        AscendC::Muls(tmp, v, 1.0f / (float)(1u << b), m);
        AscendC::Cast(off, tmp, AscendC::RoundMode::CAST_FLOOR, m);
        AscendC::Cast(tmp, off, AscendC::RoundMode::CAST_NONE, m);
        AscendC::Muls(tmp, tmp, (float)(1u << b), m);
        AscendC::Sub(v, v, tmp, m);                                     // mod 2^b
    }

    // m / 2 packed bytes -> m nibbles (low nibble first) in f1 as float: Gather duplicates byte j
    // into lanes 2j and 2j + 1, Select takes the high nibble on odd lanes, the low one on even.
    __aicore__ inline void UnpackNibbles(const AscendC::LocalTensor<uint8_t>& bytes, uint32_t m, uint32_t st)
    {
        AscendC::LocalTensor<float> nib = f1Buf_.Get<float>();
        AscendC::LocalTensor<float> tmp = f3Buf_.Get<float>();
        AscendC::LocalTensor<float> lo = f4Buf_.Get<float>();
        AscendC::LocalTensor<half> h = halfBuf_.Get<half>();
        AscendC::LocalTensor<int32_t> off = offBuf_.Get<int32_t>();
        AscendC::LocalTensor<uint8_t> odd = oddMaskBuf_.Get<uint8_t>();  // the odd-lane mask
        AscendC::LocalTensor<uint32_t> dup = groupBuf_.Get<uint32_t>();
        if (!allNibbles_) {  // groupBuf_ holds 4 * group: dup = 4 * (4 * group + lane's byte)
            AscendC::Muls(lo, groupBuf_.Get<float>(), 4.0f, m);
            PatternOp(Op::ADD, lo, lo, Lanes(st, 0), m);
            AscendC::Cast(off, lo, AscendC::RoundMode::CAST_RINT, m);
            dup = off.ReinterpretCast<uint32_t>();
        }
        AscendC::Duplicate(odd.ReinterpretCast<uint16_t>(), (uint16_t)0xAAAA, m / 16);
        AscendC::Cast(h, bytes, AscendC::RoundMode::CAST_NONE, m / 2);
        AscendC::Cast(tmp, h, AscendC::RoundMode::CAST_NONE, m / 2);
        AscendC::Gather(nib, tmp, dup, 0, m);                           // lanes 2j, 2j + 1 <- byte j
        AscendC::Muls(tmp, nib, 1.0f / 16, m);
        AscendC::Cast(off, tmp, AscendC::RoundMode::CAST_FLOOR, m);
        AscendC::Cast(tmp, off, AscendC::RoundMode::CAST_NONE, m);      // hi = floor(b / 16)
        AscendC::Muls(lo, tmp, 16.0f, m);
        AscendC::Sub(lo, nib, lo, m);                                   // lo = b - 16 * hi
        AscendC::Select(nib, odd, tmp, lo, AscendC::SELMODE::VSEL_TENSOR_TENSOR_MODE, m);
    }

    __aicore__ inline int64_t SlotOf(uint32_t token) const
    {
        return t_->slotBytes == 8 ? slot64Gm_.GetValue(token) : (int64_t)slot32Gm_.GetValue(token);
    }

    // Writes `rows` rows of head h for layer tokens [token0, token0 + rows) from a dequeued tensor.
    __aicore__ inline void WriteRows(uint32_t kv, uint32_t h, uint32_t token0, uint32_t rows,
                                     const AscendC::LocalTensor<T>& src)
    {
        const uint32_t d = t_->headDim;
        if (!paged_) {
            AscendC::DataCopy(outGm_[kv][((uint64_t)h * t_->numTokens + token0) * d], src, rows * d);
            return;
        }
        for (uint32_t r = 0; r < rows; ++r) {  // vLLM-Ascend cache: [slot, head, dim] per token
            const int64_t slot = SlotOf(token0 + r);
            if (slot < 0 || (uint64_t)slot >= t_->numSlots) continue;  // padding slot: skipped
            AscendC::DataCopy(outGm_[kv][((uint64_t)slot * t_->numHeads + h) * d], src[r * d], d);
        }
    }

    __aicore__ inline void CopyOut(uint32_t kv, uint32_t h, uint32_t token0, uint32_t rows)
    {
        AscendC::LocalTensor<T> out = outQueue_.DeQue<T>();
        WriteRows(kv, h, token0, rows, out);
        outQueue_.FreeTensor(out);
    }

    // Sinks are stored exact: anchor GM -> UB -> output through a bound VECIN/VECOUT queue.
    __aicore__ inline void CopySinks(uint32_t kv, uint32_t h, uint64_t srcByte)
    {
        const uint32_t d = t_->headDim, ns = t_->numSink;
        AscendC::GlobalTensor<T> src;
        src.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(anchor_ + srcByte), (uint64_t)t_->numHeads * ns * d);
        for (uint32_t r = 0; r < ns; r += t_->sinkRows) {
            const uint32_t rows = Min(t_->sinkRows, ns - r);
            AscendC::LocalTensor<T> s = sinkQueue_.AllocTensor<T>();
            AscendC::DataCopy(s, src[((uint64_t)h * ns + r) * d], rows * d);
            sinkQueue_.EnQue(s);
            s = sinkQueue_.DeQue<T>();
            WriteRows(kv, h, r, rows, s);
            sinkQueue_.FreeTensor(s);
        }
    }

    const LynxTiling* t_ = nullptr;
    GM_ADDR anchor_ = nullptr;
    bool paged_ = false;
    AscendC::GlobalTensor<T> outGm_[2];
    AscendC::GlobalTensor<float> magGm_[2];
    AscendC::GlobalTensor<uint8_t> anchorGm_, residualGm_;
    AscendC::GlobalTensor<int32_t> slot32Gm_;
    AscendC::GlobalTensor<int64_t> slot64Gm_;
    AscendC::LocalTensor<float> tables_;  // [2, tableSize] magnitudes of K then V, whole kernel

    AscendC::TQue<AscendC::TPosition::VECIN, 1> tableQueue_;
    AscendC::TQueBind<AscendC::TPosition::VECIN, AscendC::TPosition::VECOUT, BUFFER_NUM> sinkQueue_;
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> codeQueue_;   // packed anchor codes
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> resQueue_;    // packed residual codes
    AscendC::TQue<AscendC::TPosition::VECIN, BUFFER_NUM> statsQueue_;  // mu | sigma, float16
    AscendC::TQue<AscendC::TPosition::VECIN, 1> gammaQueue_;           // page min | max, dtype
    AscendC::TQue<AscendC::TPosition::VECOUT, BUFFER_NUM> outQueue_;   // KV rows, dtype
    AscendC::TBuf<AscendC::TPosition::VECCALC> xBuf_;                  // [blockElems] float32
    AscendC::TBuf<AscendC::TPosition::VECCALC> muBuf_, sigBuf_;        // [maxStats]
    AscendC::TBuf<AscendC::TPosition::VECCALC> spreadBuf_;             // [maxStats * 8] Brcb blocks
    AscendC::TBuf<AscendC::TPosition::VECCALC> gminBuf_, scaleBuf_;    // [dimPad]
    AscendC::TBuf<AscendC::TPosition::VECCALC> f1Buf_, f2Buf_, f3Buf_, f4Buf_, offBuf_;  // [subBlock]
    AscendC::TBuf<AscendC::TPosition::VECCALC> halfBuf_, groupBuf_;    // [subBlock]
    AscendC::TBuf<AscendC::TPosition::VECCALC> negBuf_, oddMaskBuf_;   // [subBlock] bits: sign, odd lanes
    AscendC::TBuf<AscendC::TPosition::VECCALC> laneBuf_;               // [code streams, 3] blocks
    bool allNibbles_ = false;  // K and V both 4 + 4: groupBuf_ holds the nibble Gather offsets
};

}  // namespace lynx

#define LYNX_DECOMPRESS_ENTRY(NAME, TYPE)                                                                  \
    extern "C" __global__ __aicore__ void NAME(GM_ADDR anchor, GM_ADDR residual, GM_ADDR kMags,           \
                                               GM_ADDR vMags, GM_ADDR kOut, GM_ADDR vOut,                 \
                                               GM_ADDR slotMapping, GM_ADDR tiling)                        \
    {                                                                                                      \
        LynxTiling t;                                                                                      \
        lynx::CopyTiling(&t, tiling);                                                                      \
        AscendC::TPipe pipe;                                                                               \
        lynx::LynxDecompress<TYPE> op;                                                                     \
        op.Init(anchor, residual, kMags, vMags, kOut, vOut, slotMapping, &t, &pipe);                       \
        op.Process();                                                                                      \
    }

LYNX_DECOMPRESS_ENTRY(lynx_decompress_fp16, half)
LYNX_DECOMPRESS_ENTRY(lynx_decompress_bf16, bfloat16_t)
