/*
 * Host emulation: TPipe, TQue / TQueBind and TBuf.
 *
 * Documented behaviour reproduced here: TPipe::InitBuffer carves the core's Unified Buffer
 * (192 KiB on Atlas A2) into `num` buffers of `len` bytes for a queue, or one buffer for a TBuf;
 * a queue of depth N holds at most N enqueued tensors; AllocTensor hands out a free buffer,
 * EnQue / DeQue pass it between pipeline stages (the hardware inserts the MTE2 -> V and
 * V -> MTE3 synchronisation there), FreeTensor returns it.
 *
 * Checked here (a real kernel would race or hang instead): allocating with no free buffer,
 * EnQue beyond the depth, DeQue of an empty queue, freeing a tensor that was not dequeued,
 * using a tensor in a state its pipe may not touch it in (emu_tensor.h), buffers still held when
 * the kernel object (and so its queues) ends. Freed buffers are filled with 0xFF (a float NaN) so stale reads show up.
 */
#ifndef LYNX_EMU_PIPE_H
#define LYNX_EMU_PIPE_H

#include <deque>
#include <vector>

#include "emu_tensor.h"

namespace AscendC {

constexpr uint8_t EMU_POISON = 0xFF;

class EmuQueueBase {
public:
    // A queue ends with its kernel object: every buffer must be back (FreeTensor) by then.
    virtual ~EmuQueueBase()
    {
        if (g_emuCore == nullptr || !g_emuCore->deferredError.empty()) return;
        for (const BufferCtl& b : bufs)
            if (b.state != BufState::FREE) {
                g_emuCore->deferredError = "a queue buffer was still allocated when the kernel ended "
                                           "(missing FreeTensor)";
                return;
            }
    }
    std::vector<BufferCtl> bufs;
    std::deque<BufferCtl*> fifo;
    uint32_t next = 0;  // round-robin start of the next AllocTensor
    virtual TPosition SrcPos() const = 0;
    virtual TPosition DstPos() const = 0;
    virtual int32_t Depth() const = 0;
};

class TPipe {
public:
    TPipe()
    {
        EmuCore& c = Core();
        if (c.ubUsed != 0) EmuFail("a second TPipe on one core");
        std::memset(c.ub, EMU_POISON, UB_BYTES);
    }
    ~TPipe() { Reset(); }

    template <class Q>
    bool InitBuffer(Q& que, uint8_t num, uint32_t len)
    {
        if (num == 0) EmuFail("InitBuffer: num must be >= 1");
        que.bufs.assign(num, BufferCtl{});
        for (uint8_t i = 0; i < num; ++i) {
            BufferCtl& b = que.bufs[i];
            b.src = que.SrcPos();
            b.dst = que.DstPos();
            b.state = BufState::FREE;
            b.bytes = Align(len);
            b.addr = Carve(b.bytes);
            b.owner = &que;
        }
        que.fifo.clear();
        que.next = 0;
        return true;
    }

    template <class B>
    bool InitBuffer(B& buf, uint32_t len)
    {
        buf.ctl.src = buf.ctl.dst = TPosition::VECCALC;
        buf.ctl.state = BufState::CALC;
        buf.ctl.bytes = Align(len);
        buf.ctl.addr = Carve(buf.ctl.bytes);
        buf.ctl.owner = &buf;
        return true;
    }

    // Releases the Unified Buffer (the queues check their own buffers when they end).
    void Reset() { Core().ubUsed = 0; }

private:
    static uint32_t Align(uint32_t len) { return (len + ONE_BLK_SIZE - 1) / ONE_BLK_SIZE * ONE_BLK_SIZE; }
    uint8_t* Carve(uint32_t bytes)
    {
        EmuCore& c = Core();
        if ((uint64_t)c.ubUsed + bytes > UB_BYTES)
            EmuFail("InitBuffer: " + std::to_string(c.ubUsed + (uint64_t)bytes) +
                    " bytes exceed the " + std::to_string(UB_BYTES) + "-byte Unified Buffer");
        uint8_t* p = c.ub + c.ubUsed;
        c.ubUsed += bytes;
        if (c.ubUsed > c.ubPeak) c.ubPeak = c.ubUsed;
        return p;
    }
};

template <TPosition src, TPosition dst, int32_t depth>
class TQueBind : public EmuQueueBase {
public:
    TPosition SrcPos() const override { return src; }
    TPosition DstPos() const override { return dst; }
    int32_t Depth() const override { return depth; }

    template <typename T>
    LocalTensor<T> AllocTensor()
    {
        for (uint32_t k = 0; k < bufs.size(); ++k) {
            uint32_t i = (next + k) % bufs.size();
            if (bufs[i].state == BufState::FREE) {
                next = (i + 1) % bufs.size();
                bufs[i].state = BufState::ALLOCATED;
                return LocalTensor<T>(reinterpret_cast<T*>(bufs[i].addr),
                                      bufs[i].bytes / sizeof(T), &bufs[i]);
            }
        }
        EmuFail("AllocTensor: no free buffer (queue has " + std::to_string(bufs.size()) +
                "; a tensor was not freed, or BUFFER_NUM is too small for this use)");
    }

    template <typename T>
    bool EnQue(const LocalTensor<T>& t)
    {
        BufferCtl* b = Own(t, "EnQue");
        if (b->state != BufState::ALLOCATED) EmuFail("EnQue of a tensor that is not freshly allocated");
        if ((int32_t)fifo.size() >= depth) EmuFail("EnQue beyond the queue depth " + std::to_string(depth));
        b->state = BufState::QUEUED;
        fifo.push_back(b);
        return true;
    }

    template <typename T>
    LocalTensor<T> DeQue()
    {
        if (fifo.empty()) EmuFail("DeQue of an empty queue (the producer stage never ran)");
        BufferCtl* b = fifo.front();
        fifo.pop_front();
        b->state = BufState::DEQUEUED;
        return LocalTensor<T>(reinterpret_cast<T*>(b->addr), b->bytes / sizeof(T), b);
    }

    template <typename T>
    void FreeTensor(LocalTensor<T>& t)
    {
        BufferCtl* b = Own(t, "FreeTensor");
        if (b->state != BufState::DEQUEUED) EmuFail("FreeTensor of a tensor that was not dequeued");
        std::memset(b->addr, EMU_POISON, b->bytes);
        b->state = BufState::FREE;
    }

private:
    template <typename T>
    BufferCtl* Own(const LocalTensor<T>& t, const char* op)
    {
        BufferCtl* b = t.Ctl();
        if (b == nullptr || b->owner != this) EmuFail(std::string(op) + " of a tensor from another queue");
        if ((uint8_t*)t.Addr() != b->addr) EmuFail(std::string(op) + " of a sub-tensor view");
        return b;
    }
};

template <TPosition pos, int32_t depth>
class TQue : public TQueBind<pos, pos, depth> {};

template <TPosition pos>
class TBuf {
public:
    template <typename T>
    LocalTensor<T> Get() { return LocalTensor<T>(reinterpret_cast<T*>(ctl.addr), ctl.bytes / sizeof(T), &ctl); }
    BufferCtl ctl;
};

}  // namespace AscendC

#endif  // LYNX_EMU_PIPE_H
