// Self-test of the host emulation of the Ascend C API (ascend_c/host_emu): the documented
// semantics the Lynx kernels rely on, and the rules whose violation it must catch.
// Built and run by test_emulation.py; prints one line per check, exits non-zero on a failure.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "kernel_operator.h"

using namespace AscendC;

static int g_failed = 0;

static void Check(bool ok, const char* what)
{
    std::printf("%s %s\n", ok ? "ok" : "FAIL", what);
    if (!ok) ++g_failed;
}

// Runs body on one emulated core; true if the emulation raised an error.
static bool Raises(const std::function<void()>& body)
{
    try {
        EmuLaunch(1, false, body);
    } catch (const std::runtime_error&) {
        return true;
    }
    return false;
}

static void Run(const std::function<void()>& body) { EmuLaunch(1, false, body); }

int main()
{
    Run([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> a, b, c;
        pipe.InitBuffer(a, 256 * 4);
        pipe.InitBuffer(b, 256 * 4);
        pipe.InitBuffer(c, 256 * 4);
        LocalTensor<float> x = a.Get<float>(), y = b.Get<float>(), z = c.Get<float>();

        // WholeReduceSum: binary tree over adjacent pairs within the repeat
        for (int i = 0; i < 64; ++i) x.SetValue(i, 0.0f);
        x.SetValue(0, 1e8f); x.SetValue(1, 1.0f); x.SetValue(2, -1e8f); x.SetValue(3, 1.0f);
        WholeReduceSum(y, x, 4, 1, 1, 1, 8);
        Check(y.GetValue(0) == (1e8f + 1.0f) + (-1e8f + 1.0f), "WholeReduceSum adds adjacent pairs first");

        // WholeReduceMax / Min (value only): one result per repeat of `mask` lanes, lanes past
        // the mask ignored, dstRepStride in elements, srcRepStride in 32-byte blocks
        for (int i = 0; i < 64; ++i) x.SetValue(i, (float)((i * 37) % 64) - 20.0f);
        x.SetValue(20, -99.0f);                       // lane 4 of repeat 1 (16 lanes per repeat)
        x.SetValue(5, 99.0f);                         // lane 5 of repeat 0
        WholeReduceMax(y, x, 16, 4, 1, 1, 2, ReduceOrder::ORDER_ONLY_VALUE);
        WholeReduceMin(z, x, 16, 4, 1, 1, 2, ReduceOrder::ORDER_ONLY_VALUE);
        bool ok = true;
        for (int r = 0; r < 4; ++r) {
            float hi = -1e30f, lo = 1e30f;
            for (int l = 0; l < 16; ++l) {
                hi = std::max(hi, x.GetValue(r * 16 + l));
                lo = std::min(lo, x.GetValue(r * 16 + l));
            }
            ok = ok && y.GetValue(r) == hi && z.GetValue(r) == lo;
        }
        Check(ok && y.GetValue(0) == 99.0f && z.GetValue(1) == -99.0f,
              "WholeReduceMax / Min give each repeat's extreme over its mask");
        WholeReduceMin(z, x, 8, 1, 1, 1, 8, ReduceOrder::ORDER_ONLY_VALUE);
        float lo8 = 1e30f;
        for (int l = 0; l < 8; ++l) lo8 = std::min(lo8, x.GetValue(l));
        Check(z.GetValue(0) == lo8, "WholeReduceMin ignores the lanes past the mask");

        // GatherMask built-in patterns 1 / 2: even / odd lanes, packed back to back
        for (int i = 0; i < 128; ++i) x.SetValue(i, (float)i);
        uint64_t kept = 0;
        GatherMask(y, x, 1, false, 0, GatherMaskParams(1, 2, 8, 0), kept);
        GatherMask(z, x, 2, false, 0, GatherMaskParams(1, 2, 8, 0), kept);
        Check(kept == 64 && y.GetValue(0) == 0 && y.GetValue(63) == 126 && z.GetValue(63) == 127,
              "GatherMask patterns 1 and 2 keep even / odd lanes");

        // Duplicate, bit-mask mode: only the lanes whose mask bit is set, in every repeat
        for (int i = 0; i < 128; ++i) y.SetValue(i, -1.0f);
        uint64_t lanes[2] = {(1ull << 3) | (1ull << 63), 0};
        Duplicate(y, 5.0f, lanes, 2, 1, 8);
        Check(y.GetValue(3) == 5 && y.GetValue(63) == 5 && y.GetValue(64 + 3) == 5 && y.GetValue(2) == -1 &&
              y.GetValue(64 + 4) == -1, "Duplicate with a bit mask writes only the masked lanes");

        // Brcb: each of 8 values fills one 32-byte block
        for (int i = 0; i < 128; ++i) x.SetValue(i, (float)i);
        Brcb(y, x, 1, BrcbRepeatParams(1, 8));
        Check(y.GetValue(0) == 0 && y.GetValue(7) == 0 && y.GetValue(8) == 1 && y.GetValue(63) == 7,
              "Brcb spreads each value over a 32-byte block");

        // level-0 binary op with src1 repeat stride 0: a row broadcast down the rows
        for (int i = 0; i < 16; ++i) z.SetValue(i, 100.0f * i);
        Add(y, x, z, 16, 4, BinaryRepeatParams(1, 1, 1, 2, 2, 0));
        Check(y.GetValue(16 + 3) == 19 + 300 && y.GetValue(48 + 15) == 63 + 1500,
              "src1RepStride = 0 re-reads the same row every repeat");

        // Compare / Select: element i is bit i % 8 of byte i / 8
        LocalTensor<uint8_t> m = c.Get<uint8_t>();
        CompareScalar(m, x, 3.0f, CMPMODE::LT, 64);
        Check(m.GetValue(0) == 0x07 && m.GetValue(1) == 0, "Compare writes bit i of byte i / 8");
        Select(y, m, x, -1.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, 64);
        Check(y.GetValue(2) == 2 && y.GetValue(3) == -1, "Select takes src0 where the bit is set");

        // Cast rounding
        x.SetValue(0, 1.0f + 1.0f / 2048);                       // half tie -> even
        x.SetValue(1, -2.5f);
        LocalTensor<half> h = b.Get<half>();
        Cast(h, x, RoundMode::CAST_RINT, 2);
        Check((float)h.GetValue(0) == 1.0f, "float -> half rounds ties to even");
        LocalTensor<int32_t> n = z.ReinterpretCast<int32_t>();
        Cast(n, x, RoundMode::CAST_FLOOR, 2);
        Check(n.GetValue(1) == -3, "float -> int32 CAST_FLOOR");
        Cast(n, x, RoundMode::CAST_RINT, 2);
        Check(n.GetValue(1) == -2, "float -> int32 CAST_RINT ties to even");
        x.SetValue(0, 1.0f + 1.0f / 256);                        // bfloat16 tie -> even
        LocalTensor<bfloat16_t> bf = b.Get<bfloat16_t>();
        Cast(bf, x, RoundMode::CAST_RINT, 1);
        Check(bf.GetValue(0).ToFloat() == 1.0f, "float -> bfloat16 rounds ties to even");

        // Gather by byte offsets
        LocalTensor<uint32_t> off = z.ReinterpretCast<uint32_t>();
        for (int i = 0; i < 128; ++i) x.SetValue(i, (float)i);
        off.SetValue(0, 12);
        off.SetValue(1, 0);
        Gather(y, x, off, 0, 2);
        Check(y.GetValue(0) == 3 && y.GetValue(1) == 0, "Gather reads src at byte offsets");
    });

    // DataCopyPad: byte-exact GM blocks, each starting 32-byte aligned in the Unified Buffer
    std::vector<uint8_t> gm(64), back(64, 0);
    for (int i = 0; i < 64; ++i) gm[i] = (uint8_t)i;
    Run([&] {
        TPipe pipe;
        TQueBind<TPosition::VECIN, TPosition::VECOUT, 1> q;
        pipe.InitBuffer(q, 1, 128);
        GlobalTensor<uint8_t> src, dst;
        src.SetGlobalBuffer(gm.data(), 64);
        dst.SetGlobalBuffer(back.data(), 64);
        LocalTensor<uint8_t> t = q.AllocTensor<uint8_t>();
        DataCopyPad(t, src, DataCopyExtParams(2, 5, 3, 0, 0), DataCopyPadExtParams<uint8_t>(false, 0, 0, 0));
        q.EnQue(t);
        t = q.DeQue<uint8_t>();
        DataCopyPad(dst, t, DataCopyExtParams(2, 5, 0, 11, 0));
        q.FreeTensor(t);
    });
    Check(back[0] == 0 && back[4] == 4 && back[5] == 0 && back[16] == 8 && back[20] == 12,
          "DataCopyPad moves byte-exact blocks with byte strides on GM");

    // rules a real kernel must obey
    Check(Raises([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 200 * 1024);
    }), "a Unified Buffer over 192 KiB is refused");
    Check(Raises([] {
        std::vector<float> g(16);
        TPipe pipe;
        TQue<TPosition::VECIN, 1> q;
        pipe.InitBuffer(q, 1, 64);
        GlobalTensor<float> src;
        src.SetGlobalBuffer(g.data(), 16);
        LocalTensor<float> t = q.AllocTensor<float>();
        DataCopy(t, src, 4);  // 16 bytes: not whole 32-byte blocks
    }), "DataCopy of a partial 32-byte block is refused");
    Check(Raises([] {
        std::vector<float> g(16);
        TPipe pipe;
        TQue<TPosition::VECIN, 1> q;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(q, 1, 64);
        pipe.InitBuffer(b, 64);
        GlobalTensor<float> src;
        src.SetGlobalBuffer(g.data(), 16);
        LocalTensor<float> t = q.AllocTensor<float>();
        DataCopy(t, src, 8);
        Adds(b.Get<float>(), t, 1.0f, 8);  // read before EnQue / DeQue: a race on hardware
    }), "vector use of a VECIN tensor before DeQue is refused");
    Check(Raises([] {
        TPipe pipe;
        TQue<TPosition::VECOUT, 1> q;
        pipe.InitBuffer(q, 1, 64);
        LocalTensor<float> a = q.AllocTensor<float>();
        LocalTensor<float> b = q.AllocTensor<float>();  // one buffer only
    }), "AllocTensor with no free buffer is refused");
    Check(Raises([] {
        TPipe pipe;
        TQue<TPosition::VECOUT, 2> q;
        pipe.InitBuffer(q, 2, 64);
        LocalTensor<float> a = q.AllocTensor<float>();
        q.EnQue(a);
    }), "a buffer never freed is reported when the kernel ends");
    Check(Raises([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 1024);
        LocalTensor<float> x = b.Get<float>();
        CompareScalar(x.ReinterpretCast<uint8_t>(), x, 0.0f, CMPMODE::LT, 32);  // 128 bytes
    }), "Compare over less than 256 bytes is refused");
    Check(Raises([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 1024);
        LocalTensor<float> x = b.Get<float>();
        Adds(x[3], x, 1.0f, 8);  // 12-byte offset
    }), "a tensor not 32-byte aligned is refused");
    Check(Raises([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 256);
        LocalTensor<float> x = b.Get<float>();
        Add(x, x, x, 65);  // past the 64-float buffer
    }), "an operation past the tensor's end is refused");
    Check(Raises([] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> b;
        pipe.InitBuffer(b, 512);
        uint64_t high[2] = {0, 1};  // lane 64: a float repeat has 64
        Duplicate(b.Get<float>(), 1.0f, high, 1, 1, 8);
    }), "a bit mask past a float repeat's 64 lanes is refused");
    std::printf("%d failed\n", g_failed);
    return g_failed ? 1 : 0;
}
