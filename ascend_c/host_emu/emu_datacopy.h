/*
 * Host emulation: DataCopy and DataCopyPad (MTE2: GM -> UB, MTE3: UB -> GM, V: UB -> UB).
 *
 * DataCopy moves whole 32-byte data blocks: the length (count * sizeof(T)) must be a multiple of
 * 32 bytes and the Unified Buffer address 32-byte aligned.
 * DataCopyPad moves byte-exact blocks: blockLen and the GM-side stride are in bytes, the UB-side
 * stride in 32-byte blocks, and every block starts 32-byte aligned in the Unified Buffer (a block
 * of blockLen bytes occupies ceil(blockLen / 32) data blocks there).
 */
#ifndef LYNX_EMU_DATACOPY_H
#define LYNX_EMU_DATACOPY_H

#include "emu_pipe.h"

namespace AscendC {

struct DataCopyExtParams {
    uint16_t blockCount = 1;
    uint32_t blockLen = 0;   // bytes per block
    uint32_t srcStride = 0;  // gap after each block: bytes on the GM side, 32-byte units on UB
    uint32_t dstStride = 0;
    uint32_t rsv = 0;
    DataCopyExtParams() = default;
    DataCopyExtParams(uint16_t count, uint32_t len, uint32_t srcGap, uint32_t dstGap, uint32_t r)
        : blockCount(count), blockLen(len), srcStride(srcGap), dstStride(dstGap), rsv(r) {}
};

template <typename T>
struct DataCopyPadExtParams {
    bool isPad = false;
    uint8_t leftPadding = 0;
    uint8_t rightPadding = 0;
    T paddingValue = T();
    DataCopyPadExtParams() = default;
    DataCopyPadExtParams(bool pad, uint8_t left, uint8_t right, T value)
        : isPad(pad), leftPadding(left), rightPadding(right), paddingValue(value) {}
};

namespace emu {

template <typename T>
inline void CheckMte2Dst(const LocalTensor<T>& dst, const char* op)
{
    BufferCtl* c = dst.Ctl();
    if (c == nullptr || c->src != TPosition::VECIN || c->state != BufState::ALLOCATED)
        EmuFail(std::string(op) + " GM->UB: destination must be a freshly allocated VECIN queue "
                "tensor (tensors reach the vector unit only through EnQue/DeQue)");
    CheckUbAligned(dst.Addr(), op);
}

template <typename T>
inline void CheckMte3Src(const LocalTensor<T>& src, const char* op)
{
    BufferCtl* c = src.Ctl();
    if (c == nullptr || c->dst != TPosition::VECOUT || c->state != BufState::DEQUEUED)
        EmuFail(std::string(op) + " UB->GM: source must be a dequeued VECOUT queue tensor");
    CheckUbAligned(src.Addr(), op);
}

inline void CheckFits(uint64_t bytes, uint64_t have, const char* op)
{
    if (bytes > have) EmuFail(std::string(op) + ": " + std::to_string(bytes) +
                              " bytes exceed the Unified Buffer tensor's " + std::to_string(have));
}

}  // namespace emu

// GM -> UB, `count` contiguous elements.
template <typename T>
inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, uint32_t count)
{
    emu::CheckMte2Dst(dst, "DataCopy");
    uint64_t bytes = (uint64_t)count * sizeof(T);
    if (bytes % ONE_BLK_SIZE) EmuFail("DataCopy GM->UB of " + std::to_string(bytes) +
                                      " bytes: not a multiple of 32 (use DataCopyPad)");
    emu::CheckFits(bytes, (uint64_t)dst.GetSize() * sizeof(T), "DataCopy");
    src.Check(0, count);
    std::memcpy(dst.Addr(), src.GetPhyAddr(), bytes);
}

// UB -> GM, `count` contiguous elements.
template <typename T>
inline void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, uint32_t count)
{
    emu::CheckMte3Src(src, "DataCopy");
    uint64_t bytes = (uint64_t)count * sizeof(T);
    if (bytes % ONE_BLK_SIZE) EmuFail("DataCopy UB->GM of " + std::to_string(bytes) +
                                      " bytes: not a multiple of 32 (use DataCopyPad)");
    emu::CheckFits(bytes, (uint64_t)src.GetSize() * sizeof(T), "DataCopy");
    dst.Check(0, count);
    std::memcpy(dst.GetPhyAddr(), src.Addr(), bytes);
}

// UB -> UB on the vector pipe.
template <typename T>
inline void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, uint32_t count)
{
    uint64_t bytes = (uint64_t)count * sizeof(T);
    if (bytes % ONE_BLK_SIZE) EmuFail("DataCopy UB->UB: length not a multiple of 32 bytes");
    CheckVector(dst, count, "DataCopy UB->UB");
    CheckVector(src, count, "DataCopy UB->UB");
    std::memmove(dst.Addr(), src.Addr(), bytes);
}

// GM -> UB, byte-exact blocks.
template <typename T>
inline void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src,
                        const DataCopyExtParams& p, const DataCopyPadExtParams<T>& pad)
{
    emu::CheckMte2Dst(dst, "DataCopyPad");
    if (p.blockLen % sizeof(T) || p.srcStride % sizeof(T))
        EmuFail("DataCopyPad: blockLen and srcStride must be whole elements");
    uint64_t ubBlock = (p.blockLen + ONE_BLK_SIZE - 1) / ONE_BLK_SIZE * ONE_BLK_SIZE;
    uint64_t ubStep = ubBlock + (uint64_t)p.dstStride * ONE_BLK_SIZE;
    uint64_t gmStep = p.blockLen + p.srcStride;
    emu::CheckFits(p.blockCount ? (p.blockCount - 1) * ubStep + ubBlock : 0,
                   (uint64_t)dst.GetSize() * sizeof(T), "DataCopyPad");
    uint8_t* d = (uint8_t*)dst.Addr();
    const uint8_t* s = (const uint8_t*)src.GetPhyAddr();
    for (uint32_t i = 0; i < p.blockCount; ++i) {
        src.Check((i * gmStep) / sizeof(T), p.blockLen / sizeof(T));
        std::memcpy(d + i * ubStep, s + i * gmStep, p.blockLen);
        if (pad.isPad)
            for (uint64_t j = p.blockLen; j + sizeof(T) <= ubBlock; j += sizeof(T))
                std::memcpy(d + i * ubStep + j, &pad.paddingValue, sizeof(T));
    }
}

// UB -> GM, byte-exact blocks.
template <typename T>
inline void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyExtParams& p)
{
    emu::CheckMte3Src(src, "DataCopyPad");
    if (p.blockLen % sizeof(T) || p.dstStride % sizeof(T))
        EmuFail("DataCopyPad: blockLen and dstStride must be whole elements");
    uint64_t ubBlock = (p.blockLen + ONE_BLK_SIZE - 1) / ONE_BLK_SIZE * ONE_BLK_SIZE;
    uint64_t ubStep = ubBlock + (uint64_t)p.srcStride * ONE_BLK_SIZE;
    uint64_t gmStep = p.blockLen + p.dstStride;
    emu::CheckFits(p.blockCount ? (p.blockCount - 1) * ubStep + p.blockLen : 0,
                   (uint64_t)src.GetSize() * sizeof(T), "DataCopyPad");
    uint8_t* d = (uint8_t*)dst.GetPhyAddr();
    const uint8_t* s = (const uint8_t*)src.Addr();
    for (uint32_t i = 0; i < p.blockCount; ++i) {
        dst.Check((i * gmStep) / sizeof(T), p.blockLen / sizeof(T));
        std::memcpy(d + i * gmStep, s + i * ubStep, p.blockLen);
    }
}

}  // namespace AscendC

#endif  // LYNX_EMU_DATACOPY_H
