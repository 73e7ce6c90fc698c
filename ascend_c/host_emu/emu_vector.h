/*
 * Host emulation: the vector instructions the Lynx kernels call, to their documented semantics.
 *
 * Two calling forms, as in Ascend C:
 *   "first n values" (count)  Op(dst, src0, src1, count)
 *   "high-dimensional split"  Op(dst, src0, src1, mask, repeatTimes, BinaryRepeatParams): each
 *      repeat processes the first `mask` lanes of 256 bytes (8 data blocks); lane l lives in block
 *      l / (32 / sizeof(T)); block and repeat strides are in 32-byte units. A src1 block stride of
 *      0 makes every block of a repeat read the same 32 bytes, and a repeat stride of 0 makes every
 *      repeat read the same row: that is how a per-row or per-chunk value is broadcast.
 * All float arithmetic is IEEE binary32 with round-to-nearest-even and no fused multiply-add
 * (the library is built with -ffp-contract=off), as the vector unit's single instructions are.
 * Reductions follow the documented order: within one repeat, adjacent pairs are added in a
 * binary tree ((d0+d1)+(d2+d3))+...; lanes outside the mask contribute 0 to the tree.
 */
#ifndef LYNX_EMU_VECTOR_H
#define LYNX_EMU_VECTOR_H

#include <algorithm>
#include <limits>
#include <type_traits>

#include "emu_pipe.h"

namespace AscendC {

struct BinaryRepeatParams {
    uint8_t dstBlkStride = 1, src0BlkStride = 1, src1BlkStride = 1;
    uint8_t dstRepStride = 8, src0RepStride = 8, src1RepStride = 8;
    BinaryRepeatParams() = default;
    BinaryRepeatParams(uint8_t db, uint8_t s0b, uint8_t s1b, uint8_t dr, uint8_t s0r, uint8_t s1r)
        : dstBlkStride(db), src0BlkStride(s0b), src1BlkStride(s1b),
          dstRepStride(dr), src0RepStride(s0r), src1RepStride(s1r) {}
};

struct BrcbRepeatParams {
    uint16_t dstBlkStride = 1, dstRepStride = 8;
    BrcbRepeatParams() = default;
    BrcbRepeatParams(uint16_t b, uint16_t r) : dstBlkStride(b), dstRepStride(r) {}
};

struct GatherMaskParams {
    uint8_t src0BlockStride = 1;
    uint16_t repeatTimes = 1;
    uint16_t src0RepeatStride = 8;
    uint8_t src1RepeatStride = 8;
    GatherMaskParams() = default;
    GatherMaskParams(uint8_t blk, uint16_t rep, uint16_t repStride, uint8_t src1Rep)
        : src0BlockStride(blk), repeatTimes(rep), src0RepeatStride(repStride), src1RepeatStride(src1Rep) {}
};

namespace emu {

template <typename T>
constexpr uint32_t PerBlock() { return ONE_BLK_SIZE / sizeof(T); }
template <typename T>
constexpr uint32_t PerRepeat() { return ONE_REPEAT_BYTE_SIZE / sizeof(T); }

// Element index of lane `lane` in repeat `rep` for the given strides (in 32-byte blocks).
template <typename T>
inline uint64_t LaneIndex(uint32_t rep, uint32_t lane, uint32_t blkStride, uint32_t repStride)
{
    return (uint64_t)rep * repStride * PerBlock<T>() + (uint64_t)(lane / PerBlock<T>()) * blkStride * PerBlock<T>() +
           lane % PerBlock<T>();
}

template <typename T>
inline void CheckRepeat(uint64_t mask, uint32_t repeat, const char* op)
{
    if (mask == 0 || mask > PerRepeat<T>())
        EmuFail(std::string(op) + ": mask " + std::to_string(mask) + " outside [1, " +
                std::to_string(PerRepeat<T>()) + "]");
    if (repeat > MAX_REPEAT_TIMES) EmuFail(std::string(op) + ": repeatTimes > 255");
}

template <typename T, typename F>
inline void Binary(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b,
                   uint32_t count, F f, const char* op)
{
    CheckVector(dst, count, op);
    CheckVector(a, count, op);
    CheckVector(b, count, op);
    T* d = dst.Addr();
    const T* x = a.Addr();
    const T* y = b.Addr();
    for (uint32_t i = 0; i < count; ++i) d[i] = f(x[i], y[i]);
}

template <typename T, typename F>
inline void BinaryRepeat(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b,
                         uint64_t mask, uint8_t repeat, const BinaryRepeatParams& p, F f, const char* op)
{
    CheckRepeat<T>(mask, repeat, op);
    if (repeat == 0) return;
    uint32_t lastLane = (uint32_t)mask - 1;
    uint32_t lastRep = repeat - 1u;
    CheckVector(dst, LaneIndex<T>(lastRep, lastLane, p.dstBlkStride, p.dstRepStride) + 1, op);
    CheckVector(a, LaneIndex<T>(lastRep, lastLane, p.src0BlkStride, p.src0RepStride) + 1, op);
    CheckVector(b, LaneIndex<T>(lastRep, lastLane, p.src1BlkStride, p.src1RepStride) + 1, op);
    for (uint32_t r = 0; r < repeat; ++r) {
        // a repeat reads all its lanes before writing, as one vector instruction does
        T out[PerRepeat<T>()];
        for (uint32_t l = 0; l < mask; ++l)
            out[l] = f(a.Addr()[LaneIndex<T>(r, l, p.src0BlkStride, p.src0RepStride)],
                       b.Addr()[LaneIndex<T>(r, l, p.src1BlkStride, p.src1RepStride)]);
        for (uint32_t l = 0; l < mask; ++l) dst.Addr()[LaneIndex<T>(r, l, p.dstBlkStride, p.dstRepStride)] = out[l];
    }
}

template <typename T, typename F>
inline void Unary(const LocalTensor<T>& dst, const LocalTensor<T>& src, uint32_t count, F f, const char* op)
{
    CheckVector(dst, count, op);
    CheckVector(src, count, op);
    for (uint32_t i = 0; i < count; ++i) dst.Addr()[i] = f(src.Addr()[i]);
}

inline bool Overlap(const void* a, uint64_t an, const void* b, uint64_t bn)
{
    const uint8_t* x = (const uint8_t*)a;
    const uint8_t* y = (const uint8_t*)b;
    return x < y + bn && y < x + an;
}

}  // namespace emu

#define LYNX_EMU_BINARY(NAME, EXPR)                                                                   \
    template <typename T>                                                                             \
    inline void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, \
                     const int32_t& count)                                                            \
    {                                                                                                 \
        emu::Binary(dst, src0, src1, (uint32_t)count, [](T a, T b) -> T { return EXPR; }, #NAME);     \
    }                                                                                                 \
    template <typename T, bool isSetMask = true>                                                      \
    inline void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, \
                     uint64_t mask, const uint8_t repeatTimes, const BinaryRepeatParams& params)      \
    {                                                                                                 \
        emu::BinaryRepeat(dst, src0, src1, mask, repeatTimes, params,                                 \
                          [](T a, T b) -> T { return EXPR; }, #NAME);                                 \
    }

LYNX_EMU_BINARY(Add, a + b)
LYNX_EMU_BINARY(Sub, a - b)
LYNX_EMU_BINARY(Mul, a * b)
LYNX_EMU_BINARY(Div, a / b)
LYNX_EMU_BINARY(Max, (a > b ? a : b))
LYNX_EMU_BINARY(Min, (a < b ? a : b))
#undef LYNX_EMU_BINARY

#define LYNX_EMU_SCALAR(NAME, EXPR)                                                                   \
    template <typename T>                                                                             \
    inline void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalar,           \
                     const int32_t& count)                                                            \
    {                                                                                                 \
        T s = scalar;                                                                                 \
        emu::Unary(dst, src, (uint32_t)count, [s](T a) -> T { return EXPR; }, #NAME);                \
    }

LYNX_EMU_SCALAR(Adds, a + s)
LYNX_EMU_SCALAR(Muls, a * s)
LYNX_EMU_SCALAR(Maxs, (a > s ? a : s))
LYNX_EMU_SCALAR(Mins, (a < s ? a : s))
#undef LYNX_EMU_SCALAR

template <typename T>
inline void Abs(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count)
{
    emu::Unary(dst, src, (uint32_t)count, [](T a) -> T { return a < 0 ? -a : (a == 0 ? T(0) : a); }, "Abs");
}

template <typename T>
inline void Duplicate(const LocalTensor<T>& dst, const T& scalar, const int32_t& count)
{
    CheckVector(dst, (uint32_t)count, "Duplicate");
    for (int32_t i = 0; i < count; ++i) dst.Addr()[i] = scalar;
}

// Bit-mask mode: in each repeat (256 bytes), lane l is written where bit l of the mask is set
// (mask[0]: lanes 0..63, mask[1]: lanes 64..127 of 16-bit types; 0 for 32-bit types); block and
// repeat strides in 32-byte units.
template <typename T, bool isSetMask = true>
inline void Duplicate(const LocalTensor<T>& dst, const T& scalar, uint64_t mask[], const uint8_t repeatTimes,
                      const uint16_t dstBlockStride, const uint8_t dstRepeatStride)
{
    constexpr uint32_t lanes = emu::PerRepeat<T>();
    if (lanes <= 64 && mask[1] != 0) EmuFail("Duplicate: mask[1] must be 0 for 32-bit types");
    if (repeatTimes == 0) return;
    uint32_t last = 0;
    for (uint32_t l = 0; l < lanes; ++l)
        if ((mask[l / 64] >> (l % 64)) & 1u) last = l;
    CheckVector(dst, emu::LaneIndex<T>(repeatTimes - 1u, last, dstBlockStride, dstRepeatStride) + 1, "Duplicate");
    for (uint32_t r = 0; r < repeatTimes; ++r)
        for (uint32_t l = 0; l < lanes; ++l)
            if ((mask[l / 64] >> (l % 64)) & 1u)
                dst.Addr()[emu::LaneIndex<T>(r, l, dstBlockStride, dstRepeatStride)] = scalar;
}

// dst[i] = firstValue + i
template <typename T>
inline void CreateVecIndex(LocalTensor<T> dst, const T& firstValue, uint32_t count)
{
    CheckVector(dst, count, "CreateVecIndex");
    for (uint32_t i = 0; i < count; ++i) dst.Addr()[i] = firstValue + (T)i;
}

// ---- Cast: only the (source, destination, mode) combinations the kernels use -------------------

namespace emu {

inline int32_t FloatToInt32(float v, RoundMode m)
{
    if (std::isnan(v)) return 0;
    double r;
    switch (m) {
        case RoundMode::CAST_RINT: r = std::nearbyint((double)v); break;  // ties to even
        case RoundMode::CAST_FLOOR: r = std::floor((double)v); break;
        case RoundMode::CAST_CEIL: r = std::ceil((double)v); break;
        case RoundMode::CAST_TRUNC: r = std::trunc((double)v); break;
        case RoundMode::CAST_ROUND: r = std::round((double)v); break;     // ties away from zero
        default: EmuFail("Cast float->int32 needs an explicit rounding mode");
    }
    r = std::min(std::max(r, (double)INT32_MIN), (double)INT32_MAX);  // saturates
    return (int32_t)r;
}

template <typename D, typename S>
inline D CastOne(S v, RoundMode m)
{
    if constexpr (std::is_same_v<S, half> && std::is_same_v<D, float>) {
        if (m != RoundMode::CAST_NONE) EmuFail("Cast half->float takes CAST_NONE");
        return (float)v;
    } else if constexpr (std::is_same_v<S, bfloat16_t> && std::is_same_v<D, float>) {
        if (m != RoundMode::CAST_NONE) EmuFail("Cast bfloat16->float takes CAST_NONE");
        return v.ToFloat();
    } else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, half>) {
        if (m != RoundMode::CAST_NONE && m != RoundMode::CAST_RINT)
            EmuFail("Cast float->half: only CAST_NONE / CAST_RINT are emulated");
        return (half)v;  // IEEE round to nearest even (CAST_NONE rounds like CAST_RINT when lossy)
    } else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, bfloat16_t>) {
        if (m != RoundMode::CAST_RINT) EmuFail("Cast float->bfloat16: only CAST_RINT is emulated");
        return bfloat16_t::FromFloatRint(v);
    } else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, int32_t>) {
        return FloatToInt32(v, m);
    } else if constexpr (std::is_same_v<S, int32_t> && std::is_same_v<D, float>) {
        if (m != RoundMode::CAST_NONE) EmuFail("Cast int32->float takes CAST_NONE");
        return (float)v;
    } else if constexpr (std::is_same_v<S, uint8_t> && std::is_same_v<D, half>) {
        if (m != RoundMode::CAST_NONE) EmuFail("Cast uint8->half takes CAST_NONE");
        return (half)(float)v;
    } else if constexpr (std::is_same_v<S, half> && std::is_same_v<D, uint8_t>) {
        if (m != RoundMode::CAST_NONE) EmuFail("Cast half->uint8: only CAST_NONE is emulated");
        float f = std::nearbyint((float)v);
        if (std::isnan(f)) return 0;
        return (uint8_t)std::min(std::max(f, 0.0f), 255.0f);
    } else {
        static_assert(sizeof(D) == 0, "Cast combination not in the emulated subset");
    }
}

}  // namespace emu

template <typename D, typename S>
inline void Cast(const LocalTensor<D>& dst, const LocalTensor<S>& src, const RoundMode& mode, const uint32_t count)
{
    CheckVector(dst, count, "Cast");
    CheckVector(src, count, "Cast");
    if (sizeof(D) != sizeof(S) &&
        emu::Overlap(dst.Addr(), (uint64_t)count * sizeof(D), src.Addr(), (uint64_t)count * sizeof(S)))
        EmuFail("Cast between types of different width must not overlap in place");
    for (uint32_t i = 0; i < count; ++i) dst.Addr()[i] = emu::CastOne<D, S>(src.Addr()[i], mode);
}

// ---- Compare / Select: 1 bit per element, element i is bit (i % 8) of byte i / 8 --------------

namespace emu {

template <typename T>
inline bool Cmp(T a, T b, CMPMODE m)
{
    switch (m) {
        case CMPMODE::LT: return a < b;
        case CMPMODE::GT: return a > b;
        case CMPMODE::EQ: return a == b;
        case CMPMODE::LE: return a <= b;
        case CMPMODE::GE: return a >= b;
        default: return a != b;
    }
}

template <typename T>
inline void CheckCompareCount(uint32_t count, const char* op)
{
    if ((uint64_t)count * sizeof(T) % ONE_REPEAT_BYTE_SIZE)
        EmuFail(std::string(op) + ": count * sizeof(T) must be a multiple of 256 bytes");
}

inline void SetBit(uint8_t* m, uint32_t i, bool v)
{
    if (v) m[i / 8] |= (uint8_t)(1u << (i % 8));
    else m[i / 8] &= (uint8_t)~(1u << (i % 8));
}

}  // namespace emu

template <typename T, typename U>
inline void Compare(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
                    CMPMODE mode, uint32_t count)
{
    emu::CheckCompareCount<T>(count, "Compare");
    CheckVector(src0, count, "Compare");
    CheckVector(src1, count, "Compare");
    CheckVector(dst.template ReinterpretCast<uint8_t>(), count / 8, "Compare");
    uint8_t* m = (uint8_t*)dst.Addr();
    for (uint32_t i = 0; i < count; ++i) emu::SetBit(m, i, emu::Cmp(src0.Addr()[i], src1.Addr()[i], mode));
}

template <typename T, typename U>
inline void CompareScalar(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const T src1Scalar,
                          CMPMODE mode, uint32_t count)
{
    emu::CheckCompareCount<T>(count, "CompareScalar");
    CheckVector(src0, count, "CompareScalar");
    CheckVector(dst.template ReinterpretCast<uint8_t>(), count / 8, "CompareScalar");
    uint8_t* m = (uint8_t*)dst.Addr();
    for (uint32_t i = 0; i < count; ++i) emu::SetBit(m, i, emu::Cmp(src0.Addr()[i], src1Scalar, mode));
}

// dst[i] = bit i of selMask ? src0[i] : src1[i] (or the scalar)
template <typename T, typename U>
inline void Select(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0,
                   const LocalTensor<T>& src1, SELMODE mode, uint32_t count)
{
    if (mode != SELMODE::VSEL_TENSOR_TENSOR_MODE) EmuFail("Select(tensor, tensor) needs VSEL_TENSOR_TENSOR_MODE");
    CheckVector(dst, count, "Select");
    CheckVector(src0, count, "Select");
    CheckVector(src1, count, "Select");
    CheckVector(selMask.template ReinterpretCast<uint8_t>(), (count + 7) / 8, "Select");
    const uint8_t* m = (const uint8_t*)selMask.Addr();
    for (uint32_t i = 0; i < count; ++i)
        dst.Addr()[i] = (m[i / 8] >> (i % 8)) & 1u ? src0.Addr()[i] : src1.Addr()[i];
}

template <typename T, typename U>
inline void Select(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0,
                   T src1Scalar, SELMODE mode, uint32_t count)
{
    if (mode != SELMODE::VSEL_TENSOR_SCALAR_MODE) EmuFail("Select(tensor, scalar) needs VSEL_TENSOR_SCALAR_MODE");
    CheckVector(dst, count, "Select");
    CheckVector(src0, count, "Select");
    CheckVector(selMask.template ReinterpretCast<uint8_t>(), (count + 7) / 8, "Select");
    const uint8_t* m = (const uint8_t*)selMask.Addr();
    for (uint32_t i = 0; i < count; ++i)
        dst.Addr()[i] = (m[i / 8] >> (i % 8)) & 1u ? src0.Addr()[i] : src1Scalar;
}

// ---- Gather / GatherMask / Brcb -------------------------------------------------------------

// dst[i] = element at byte offset srcBaseAddr + srcOffset[i] of src
template <typename T>
inline void Gather(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<uint32_t>& srcOffset,
                   const uint32_t srcBaseAddr, const uint32_t count)
{
    CheckVector(dst, count, "Gather");
    CheckVector(srcOffset, count, "Gather");
    CheckVector(src, 1, "Gather");
    uint64_t have = (uint64_t)src.GetSize() * sizeof(T);
    if (emu::Overlap(dst.Addr(), (uint64_t)count * sizeof(T), src.Addr(), have))
        EmuFail("Gather: dst must not overlap src");
    for (uint32_t i = 0; i < count; ++i) {
        uint64_t off = (uint64_t)srcBaseAddr + srcOffset.Addr()[i];
        if (off % sizeof(T) || off + sizeof(T) > have)
            EmuFail("Gather: byte offset " + std::to_string(off) + " outside the source tensor or misaligned");
        std::memcpy(&dst.Addr()[i], (const uint8_t*)src.Addr() + off, sizeof(T));
    }
}

// Normal mode (reduceMode = false) with a built-in pattern: per repeat of 256 bytes, pattern 1
// keeps even lanes, 2 odd lanes, 3..6 lane 0..3 of every 4, 7 all; kept elements are written to
// dst back to back; rsvdCnt returns how many.
template <typename T>
inline void GatherMask(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const uint8_t src1Pattern,
                       const bool reduceMode, const uint32_t mask, const GatherMaskParams& p, uint64_t& rsvdCnt)
{
    (void)mask;
    if (reduceMode) EmuFail("GatherMask: only normal mode (reduceMode = false) is emulated");
    if (src1Pattern < 1 || src1Pattern > 7) EmuFail("GatherMask: built-in pattern must be 1..7");
    uint32_t lanes = emu::PerRepeat<T>();
    CheckVector(src0, p.repeatTimes ? emu::LaneIndex<T>(p.repeatTimes - 1, lanes - 1, p.src0BlockStride,
                                                        p.src0RepeatStride) + 1 : 0, "GatherMask");
    uint64_t n = 0;
    for (uint32_t r = 0; r < p.repeatTimes; ++r)
        for (uint32_t l = 0; l < lanes; ++l) {
            bool keep = src1Pattern == 1 ? l % 2 == 0 : src1Pattern == 2 ? l % 2 == 1
                      : src1Pattern == 7 ? true : l % 4 == (uint32_t)(src1Pattern - 3);
            if (!keep) continue;
            CheckVector(dst, n + 1, "GatherMask");
            dst.Addr()[n++] = src0.Addr()[emu::LaneIndex<T>(r, l, p.src0BlockStride, p.src0RepeatStride)];
        }
    rsvdCnt = n;
}

// Each repeat takes 8 elements of src0 and fills one 32-byte block of dst with each.
template <typename T>
inline void Brcb(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const uint8_t repeatTimes,
                 const BrcbRepeatParams& p)
{
    if (repeatTimes == 0) return;
    const uint32_t per = emu::PerBlock<T>();
    CheckVector(src0, (uint32_t)repeatTimes * 8, "Brcb");
    CheckVector(dst, ((uint64_t)(repeatTimes - 1) * p.dstRepStride + 7ull * p.dstBlkStride + 1) * per, "Brcb");
    for (uint32_t r = 0; r < repeatTimes; ++r)
        for (uint32_t i = 0; i < 8; ++i) {
            T v = src0.Addr()[r * 8 + i];
            uint64_t base = ((uint64_t)r * p.dstRepStride + (uint64_t)i * p.dstBlkStride) * per;
            for (uint32_t e = 0; e < per; ++e) dst.Addr()[base + e] = v;
        }
}

// ---- per-repeat reductions ------------------------------------------------------------------

namespace emu {

template <typename T, typename F>
inline void WholeReduce(const LocalTensor<T>& dst, const LocalTensor<T>& src, int32_t mask, int32_t repeat,
                        int32_t dstRepStride, int32_t srcBlkStride, int32_t srcRepStride, T identity, F f,
                        bool tree, const char* op)
{
    CheckRepeat<T>((uint64_t)mask, (uint32_t)repeat, op);
    if (repeat == 0) return;
    CheckVector(src, LaneIndex<T>(repeat - 1, mask - 1, srcBlkStride, srcRepStride) + 1, op);
    CheckVector(dst, (uint64_t)(repeat - 1) * dstRepStride + 1, op);
    constexpr uint32_t lanes = PerRepeat<T>();
    for (int32_t r = 0; r < repeat; ++r) {
        T v[lanes];
        for (uint32_t l = 0; l < lanes; ++l)
            v[l] = (int32_t)l < mask ? src.Addr()[LaneIndex<T>(r, l, srcBlkStride, srcRepStride)] : identity;
        if (tree) {
            for (uint32_t width = lanes; width > 1; width /= 2)
                for (uint32_t i = 0; i < width / 2; ++i) v[i] = f(v[2 * i], v[2 * i + 1]);
        } else {
            for (uint32_t l = 1; l < (uint32_t)mask; ++l) v[0] = f(v[0], v[l]);
        }
        dst.Addr()[(uint64_t)r * dstRepStride] = v[0];
    }
}

}  // namespace emu

// One sum per repeat (binary tree over the repeat's lanes); dstRepStride in elements.
template <typename T, bool isSetMask = true>
inline void WholeReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t mask,
                           const int32_t repeatTimes, const int32_t dstRepStride, const int32_t srcBlkStride,
                           const int32_t srcRepStride)
{
    emu::WholeReduce(dst, src, mask, repeatTimes, dstRepStride, srcBlkStride, srcRepStride, T(0),
                     [](T a, T b) -> T { return a + b; }, true, "WholeReduceSum");
}

// One maximum per repeat; only ReduceOrder::ORDER_ONLY_VALUE (value without index) is emulated.
template <typename T, bool isSetMask = true>
inline void WholeReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t mask,
                           const int32_t repeatTimes, const int32_t dstRepStride, const int32_t srcBlkStride,
                           const int32_t srcRepStride, ReduceOrder order = ReduceOrder::ORDER_VALUE_INDEX)
{
    if (order != ReduceOrder::ORDER_ONLY_VALUE) EmuFail("WholeReduceMax: only ORDER_ONLY_VALUE is emulated");
    emu::WholeReduce(dst, src, mask, repeatTimes, dstRepStride, srcBlkStride, srcRepStride,
                     -std::numeric_limits<T>::infinity(), [](T a, T b) -> T { return a > b ? a : b; }, false,
                     "WholeReduceMax");
}

// One minimum per repeat; only ReduceOrder::ORDER_ONLY_VALUE (value without index) is emulated.
template <typename T, bool isSetMask = true>
inline void WholeReduceMin(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t mask,
                           const int32_t repeatTimes, const int32_t dstRepStride, const int32_t srcBlkStride,
                           const int32_t srcRepStride, ReduceOrder order = ReduceOrder::ORDER_VALUE_INDEX)
{
    if (order != ReduceOrder::ORDER_ONLY_VALUE) EmuFail("WholeReduceMin: only ORDER_ONLY_VALUE is emulated");
    emu::WholeReduce(dst, src, mask, repeatTimes, dstRepStride, srcBlkStride, srcRepStride,
                     std::numeric_limits<T>::infinity(), [](T a, T b) -> T { return a < b ? a : b; }, false,
                     "WholeReduceMin");
}

}  // namespace AscendC

#endif  // LYNX_EMU_VECTOR_H
