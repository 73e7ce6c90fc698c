/*
 * Host emulation: LocalTensor (Unified Buffer), GlobalTensor (GM) and the buffer ownership
 * record every Unified Buffer tensor carries, so each operation can check that it touches the
 * tensor in a state a real kernel would be allowed to (see emu_pipe.h for the states).
 */
#ifndef LYNX_EMU_TENSOR_H
#define LYNX_EMU_TENSOR_H

#include "emu_base.h"

namespace AscendC {

enum class BufState { FREE, ALLOCATED, QUEUED, DEQUEUED, CALC };

// One physical buffer of a TQue / TQueBind / TBuf.
struct BufferCtl {
    TPosition src = TPosition::VECCALC;  // where data enters the buffer
    TPosition dst = TPosition::VECCALC;  // where it leaves
    BufState state = BufState::CALC;
    uint8_t* addr = nullptr;
    uint32_t bytes = 0;
    const void* owner = nullptr;         // the queue that owns it
};

template <typename T>
class LocalTensor {
public:
    LocalTensor() = default;
    LocalTensor(T* addr, uint32_t size, BufferCtl* ctl) : addr_(addr), size_(size), ctl_(ctl) {}

    // A view starting `offset` elements in (Ascend C: tensor[offset]).
    LocalTensor operator[](uint32_t offset) const
    {
        if (offset > size_) EmuFail("LocalTensor[" + std::to_string(offset) + "] past its " +
                                    std::to_string(size_) + " elements");
        return LocalTensor(addr_ + offset, size_ - offset, ctl_);
    }

    template <typename U>
    LocalTensor<U> ReinterpretCast() const
    {
        return LocalTensor<U>(reinterpret_cast<U*>(addr_),
                              (uint32_t)((uint64_t)size_ * sizeof(T) / sizeof(U)), ctl_);
    }

    uint32_t GetSize() const { return size_; }

    // Scalar access: only to calculation buffers, which the scalar unit owns between vector ops.
    T GetValue(uint32_t i) const
    {
        CheckScalar(i);
        return addr_[i];
    }
    void SetValue(uint32_t i, T v)
    {
        CheckScalar(i);
        addr_[i] = v;
    }

    T* Addr() const { return addr_; }
    BufferCtl* Ctl() const { return ctl_; }
    uint32_t UbOffset() const { return (uint32_t)((const uint8_t*)addr_ - Core().ub); }

private:
    void CheckScalar(uint32_t i) const
    {
        if (ctl_ == nullptr || ctl_->state != BufState::CALC)
            EmuFail("scalar GetValue/SetValue on a queue tensor (only TBuf tensors here)");
        if (i >= size_) EmuFail("scalar access out of range");
    }

    T* addr_ = nullptr;
    uint32_t size_ = 0;  // elements from addr_ to the end of the buffer
    BufferCtl* ctl_ = nullptr;
};

template <typename T>
class GlobalTensor {
public:
    void SetGlobalBuffer(__gm__ T* buffer, uint64_t bufferSize)
    {
        addr_ = buffer;
        size_ = bufferSize;
    }
    void SetGlobalBuffer(__gm__ T* buffer)
    {
        addr_ = buffer;
        size_ = UINT64_MAX;
    }
    GlobalTensor operator[](uint64_t offset) const
    {
        if (offset > size_) EmuFail("GlobalTensor[" + std::to_string(offset) + "] past its end");
        GlobalTensor g;
        g.addr_ = addr_ + offset;
        g.size_ = size_ == UINT64_MAX ? UINT64_MAX : size_ - offset;
        return g;
    }
    T GetValue(uint64_t i) const
    {
        Check(i, 1);
        return addr_[i];
    }
    void SetValue(uint64_t i, const T& v)
    {
        Check(i, 1);
        addr_[i] = v;
    }
    __gm__ T* GetPhyAddr() const { return addr_; }
    uint64_t Size() const { return size_; }
    void Check(uint64_t first, uint64_t count) const
    {
        if (addr_ == nullptr) EmuFail("GlobalTensor used before SetGlobalBuffer");
        if (size_ != UINT64_MAX && first + count > size_)
            EmuFail("GM access [" + std::to_string(first) + ", +" + std::to_string(count) +
                    ") past a GlobalTensor of " + std::to_string(size_) + " elements");
    }

private:
    T* addr_ = nullptr;
    uint64_t size_ = 0;
};

// ---- access rules -------------------------------------------------------------------------

inline void CheckUbAligned(const void* p, const char* op)
{
    uint64_t off = (uint64_t)((const uint8_t*)p - Core().ub);
    if (off >= UB_BYTES) EmuFail(std::string(op) + ": tensor is not in this core's Unified Buffer");
    if (off % ONE_BLK_SIZE) EmuFail(std::string(op) + ": Unified Buffer address " +
                                    std::to_string(off) + " is not 32-byte aligned");
}

// Vector (PIPE_V) access: calculation buffers always; VECIN tensors only after DeQue (the copy
// in has landed); VECOUT tensors only between AllocTensor and EnQue (before the copy out).
template <typename T>
inline void CheckVector(const LocalTensor<T>& t, uint64_t elems, const char* op)
{
    BufferCtl* c = t.Ctl();
    if (c == nullptr) EmuFail(std::string(op) + ": uninitialised LocalTensor");
    bool ok = c->state == BufState::CALC ||
              (c->src == TPosition::VECIN && c->dst == TPosition::VECIN &&
               c->state == BufState::DEQUEUED) ||
              (c->src == TPosition::VECOUT && c->dst == TPosition::VECOUT &&
               c->state == BufState::ALLOCATED);
    if (!ok) EmuFail(std::string(op) + ": vector access to a queue tensor in the wrong state "
                     "(VECIN needs DeQue first; VECOUT must not be touched after EnQue)");
    CheckUbAligned(t.Addr(), op);
    if (elems > t.GetSize())
        EmuFail(std::string(op) + ": " + std::to_string(elems) + " elements exceed the tensor's " +
                std::to_string(t.GetSize()));
}

}  // namespace AscendC

#endif  // LYNX_EMU_TENSOR_H
