/*
 * Pieces shared by the Lynx compress and decompress kernels: the pipeline depth, the tiling
 * copy, and the broadcast / fold helpers written with the documented vector instructions.
 *
 * Broadcasts use the high-dimensional ("mask + repeatTimes + BinaryRepeatParams") form of the
 * binary instructions: a src1 repeat stride of 0 re-reads the same row for every repeat (a
 * per-channel value down the rows of a block), and a src1 block stride of 0 re-reads the same
 * 32-byte block for every block of a repeat (a per-chunk value that Brcb spread over a block).
 */
#ifndef LYNX_KERNEL_COMMON_H
#define LYNX_KERNEL_COMMON_H

#include "kernel_operator.h"
#include "lynx_tiling.h"

#ifndef LYNX_BUFFER_NUM
#define LYNX_BUFFER_NUM 2
#endif

namespace lynx {

// Buffers per pipelined queue: 2 = ping-pong, the copy-in of block i+1 overlaps the compute of
// block i (1 is built only to test that double buffering does not change a byte).
constexpr int32_t BUFFER_NUM = LYNX_BUFFER_NUM;
constexpr uint32_t REPEAT_FLOATS = 64;     // float32 lanes of one 256-byte repeat
constexpr uint32_t BLOCK_FLOATS = 8;       // float32 values of one 32-byte block
constexpr uint32_t MAX_REPEAT = 255;       // repeatTimes is 8-bit
constexpr uint32_t REDUCE_STEP = 248;      // repeats per WholeReduce call: keeps dst 32-byte aligned
constexpr float F_INF = __builtin_inff();

__aicore__ inline void CopyTiling(LynxTiling* tiling, GM_ADDR tilingGm)
{
    uint32_t* dst = reinterpret_cast<uint32_t*>(tiling);
    __gm__ uint32_t* src = reinterpret_cast<__gm__ uint32_t*>(tilingGm);
    for (uint32_t i = 0; i < sizeof(LynxTiling) / sizeof(uint32_t); ++i) dst[i] = src[i];
}

__aicore__ inline uint32_t Min(uint32_t a, uint32_t b) { return a < b ? a : b; }
__aicore__ inline uint32_t CeilDiv(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

enum class Op { ADD, SUB, MUL, DIV, MIN, MAX };

__aicore__ inline void BinaryRepeat(Op op, const AscendC::LocalTensor<float>& dst,
                                    const AscendC::LocalTensor<float>& a, const AscendC::LocalTensor<float>& b,
                                    uint64_t mask, uint8_t repeat, const AscendC::BinaryRepeatParams& p)
{
    switch (op) {
        case Op::ADD: AscendC::Add(dst, a, b, mask, repeat, p); break;
        case Op::SUB: AscendC::Sub(dst, a, b, mask, repeat, p); break;
        case Op::MUL: AscendC::Mul(dst, a, b, mask, repeat, p); break;
        case Op::DIV: AscendC::Div(dst, a, b, mask, repeat, p); break;
        case Op::MIN: AscendC::Min(dst, a, b, mask, repeat, p); break;
        default: AscendC::Max(dst, a, b, mask, repeat, p); break;
    }
}

__aicore__ inline void Binary(Op op, const AscendC::LocalTensor<float>& dst, const AscendC::LocalTensor<float>& a,
                              const AscendC::LocalTensor<float>& b, uint32_t count)
{
    switch (op) {
        case Op::ADD: AscendC::Add(dst, a, b, count); break;
        case Op::SUB: AscendC::Sub(dst, a, b, count); break;
        case Op::MUL: AscendC::Mul(dst, a, b, count); break;
        case Op::DIV: AscendC::Div(dst, a, b, count); break;
        case Op::MIN: AscendC::Min(dst, a, b, count); break;
        default: AscendC::Max(dst, a, b, count); break;
    }
}

// dst[r, c] = op(src[r, c], row[c]) over a [rows, width] block (width % 16 == 0, <= 2040).
__aicore__ inline void RowBroadcast(Op op, const AscendC::LocalTensor<float>& dst, const AscendC::LocalTensor<float>& src,
                                    const AscendC::LocalTensor<float>& row, uint32_t rows, uint32_t width)
{
    const uint8_t rowBlocks = (uint8_t)(width / BLOCK_FLOATS);
    const AscendC::BinaryRepeatParams p(1, 1, 1, rowBlocks, rowBlocks, 0);
    for (uint32_t c0 = 0; c0 < width; c0 += REPEAT_FLOATS) {
        const uint64_t mask = Min(REPEAT_FLOATS, width - c0);
        for (uint32_t r0 = 0; r0 < rows; r0 += MAX_REPEAT) {
            const uint32_t off = r0 * width + c0;
            BinaryRepeat(op, dst[off], src[off], row[c0], mask, (uint8_t)Min(MAX_REPEAT, rows - r0), p);
        }
    }
}

// dst[i] = op(src[i], vals[i / chunk]) for `count` chunks of `chunk` (<= 64, % 8 == 0)
// contiguous values; `spread` (count rounded up to 8, times 8 floats) receives Brcb's blocks.
__aicore__ inline void ChunkBroadcast(Op op, const AscendC::LocalTensor<float>& dst, const AscendC::LocalTensor<float>& src,
                                      const AscendC::LocalTensor<float>& vals, const AscendC::LocalTensor<float>& spread,
                                      uint32_t count, uint32_t chunk)
{
    const uint32_t brcbRepeats = CeilDiv(count, 8);
    for (uint32_t r0 = 0; r0 < brcbRepeats; r0 += MAX_REPEAT)
        AscendC::Brcb(spread[r0 * REPEAT_FLOATS], vals[r0 * 8], (uint8_t)Min(MAX_REPEAT, brcbRepeats - r0),
                      AscendC::BrcbRepeatParams(1, 8));
    const uint8_t chunkBlocks = (uint8_t)(chunk / BLOCK_FLOATS);
    const AscendC::BinaryRepeatParams p(1, 1, 0, chunkBlocks, chunkBlocks, 1);
    for (uint32_t r0 = 0; r0 < count; r0 += MAX_REPEAT)
        BinaryRepeat(op, dst[r0 * chunk], src[r0 * chunk], spread[r0 * BLOCK_FLOATS], chunk,
                     (uint8_t)Min(MAX_REPEAT, count - r0), p);
}

// b-bit codes (b = 1..7) in wire format: an LSB-first bit stream (lynx_npu/codec/packing.py).
// 8 values fill b bytes, so value u (0..7) of each 8-value group starts in byte u*b/8 of its
// group at bit u*b%8, and spills into the next byte when that bit + b > 8. With float32 lanes,
// a group is one 32-byte block: per-lane constants of a width are one block, re-read by every
// block of a repeat (PatternOp).
__aicore__ inline uint32_t LaneByte(uint32_t b, uint32_t u) { return u * b / 8; }
__aicore__ inline uint32_t LaneShift(uint32_t b, uint32_t u) { return u * b % 8; }
__aicore__ inline uint32_t LaneSpills(uint32_t b, uint32_t u) { return u * b % 8 + b > 8 ? 1 : 0; }

// block[u] = vals[u] for the 8 lanes of one block: a bit-mask Duplicate per lane.
__aicore__ inline void SetLanes(const AscendC::LocalTensor<float>& block, const float (&vals)[BLOCK_FLOATS])
{
    for (uint32_t u = 0; u < BLOCK_FLOATS; ++u) {
        uint64_t mask[2] = {1ull << u, 0};
        AscendC::Duplicate(block, vals[u], mask, 1, 1, 8);
    }
}

// dst[i] = op(src[i], pattern[i % 8]) for count (% 64 == 0) values.
__aicore__ inline void PatternOp(Op op, const AscendC::LocalTensor<float>& dst, const AscendC::LocalTensor<float>& src,
                                 const AscendC::LocalTensor<float>& pattern, uint32_t count)
{
    const AscendC::BinaryRepeatParams p(1, 1, 0, 8, 8, 0);
    const uint32_t repeats = count / REPEAT_FLOATS;
    for (uint32_t r0 = 0; r0 < repeats; r0 += MAX_REPEAT)
        BinaryRepeat(op, dst[r0 * REPEAT_FLOATS], src[r0 * REPEAT_FLOATS], pattern, REPEAT_FLOATS,
                     (uint8_t)Min(MAX_REPEAT, repeats - r0), p);
}

// Folds rows [0, rows) of a [rows, width] block into row 0 with op (sum / min / max): the
// upper half is combined onto the lower half until one row is left (a fixed pairwise tree).
__aicore__ inline void FoldRows(Op op, const AscendC::LocalTensor<float>& buf, uint32_t rows, uint32_t width)
{
    while (rows > 1) {
        const uint32_t half = rows / 2;
        Binary(op, buf, buf, buf[(rows - half) * width], half * width);
        rows -= half;
    }
}

// v = RN(1 / v), or 0 where that is not finite (v == 0: a constant channel or chunk, which
// then normalises to 0; lynx_ref.reciprocal_or_zero). v >= 0; ones is scratch of count64 floats.
__aicore__ inline void ReciprocalOrZero(const AscendC::LocalTensor<float>& v, const AscendC::LocalTensor<float>& ones,
                                        const AscendC::LocalTensor<uint8_t>& mask, uint32_t count64)
{
    AscendC::Duplicate(ones, 1.0f, count64);
    AscendC::Div(v, ones, v, count64);
    AscendC::CompareScalar(mask, v, F_INF, AscendC::CMPMODE::LT, count64);
    AscendC::Select(v, mask, v, 0.0f, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, count64);
}

// Casts to the KV dtype (round to nearest even).
template <typename T>
__aicore__ inline void CastToKv(const AscendC::LocalTensor<T>& dst, const AscendC::LocalTensor<float>& src, uint32_t n)
{
    AscendC::Cast(dst, src, AscendC::RoundMode::CAST_RINT, n);
}

// The KV dtype's largest finite value (float16 65504, bfloat16 0x7f7f).
template <typename T>
__aicore__ inline constexpr float KvMax()
{
    return std::is_same<T, half>::value ? 65504.0f : 3.38953139e38f;
}

// Decoded values -> the KV dtype, saturated to its finite range first (codec/base.py
// to_kv_dtype): rounded scalars can put the reconstruction of a finite input a hair past the
// range, which would round to Inf. src is clobbered.
template <typename T>
__aicore__ inline void SaturateToKv(const AscendC::LocalTensor<T>& dst, const AscendC::LocalTensor<float>& src, uint32_t n)
{
    AscendC::Maxs(src, src, -KvMax<T>(), n);
    AscendC::Mins(src, src, KvMax<T>(), n);
    CastToKv(dst, src, n);
}

}  // namespace lynx

#endif  // LYNX_KERNEL_COMMON_H
