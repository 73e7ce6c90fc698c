/*
 * Host emulation of the Ascend C API subset the Lynx kernels use: basic types and enums.
 *
 * This is NOT the CANN toolkit. It lets the kernel sources in ../kernels compile with g++ so CI
 * can check them against the reference codec. Every call is written to the documented
 * semantics of the Ascend C API (CANN 8.x, Atlas A2 / 910B AI Vector core) and additionally
 * *checks* the rules a real kernel must obey (32-byte alignment, Unified Buffer size, queue
 * hand-over discipline, repeat limits). Passing here is not hardware validation.
 */
#ifndef LYNX_EMU_BASE_H
#define LYNX_EMU_BASE_H

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#define __aicore__
#define __global__
#define __gm__
#define GM_ADDR uint8_t*

// float16: the x86-64 g++ extension type converts with IEEE round-to-nearest-even.
using half = _Float16;

// bfloat16: the top 16 bits of a float32; conversions from float round to nearest even.
struct bfloat16_t {
    uint16_t bits = 0;
    bfloat16_t() = default;
    static bfloat16_t FromFloatRint(float f)
    {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        bfloat16_t b;
        if (std::isnan(f)) {
            b.bits = 0x7FC0;
        } else {
            u += 0x7FFFu + ((u >> 16) & 1u);
            b.bits = (uint16_t)(u >> 16);
        }
        return b;
    }
    float ToFloat() const
    {
        uint32_t u = (uint32_t)bits << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
};

namespace AscendC {

[[noreturn]] inline void EmuFail(const std::string& what)
{
    throw std::runtime_error("ascend_c host emulation: " + what);
}

constexpr uint32_t UB_BYTES = 192 * 1024;    // Unified Buffer of one Atlas A2 AI Vector core
constexpr uint32_t ONE_BLK_SIZE = 32;        // bytes per data block
constexpr uint32_t ONE_REPEAT_BYTE_SIZE = 256;  // bytes one vector repeat processes
constexpr uint32_t MAX_REPEAT_TIMES = 255;

enum class TPosition { GM, VECIN, VECOUT, VECCALC };
using QuePosition = TPosition;

// Cast rounding modes. CAST_NONE: exact conversion, or round-to-nearest-even when lossy.
enum class RoundMode { CAST_NONE, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD };
enum class CMPMODE { LT, GT, EQ, LE, GE, NE };
enum class SELMODE { VSEL_CMPMASK_SPR, VSEL_TENSOR_SCALAR_MODE, VSEL_TENSOR_TENSOR_MODE };
enum class ReduceOrder { ORDER_VALUE_INDEX, ORDER_INDEX_VALUE, ORDER_ONLY_VALUE, ORDER_ONLY_INDEX };
// Per-core state: which block this is and its private Unified Buffer.
struct EmuCore {
    uint32_t blockIdx = 0;
    uint32_t blockNum = 1;
    uint8_t* ub = nullptr;      // UB_BYTES, 32-byte aligned
    uint32_t ubUsed = 0;        // bytes handed out by the TPipe
    uint32_t ubPeak = 0;
    std::string deferredError;  // raised after the kernel returns (e.g. leaked buffers)
};

inline thread_local EmuCore* g_emuCore = nullptr;

inline EmuCore& Core()
{
    if (g_emuCore == nullptr) EmuFail("no core context: kernels must run through EmuLaunch");
    return *g_emuCore;
}

inline int64_t GetBlockIdx() { return Core().blockIdx; }
inline int64_t GetBlockNum() { return Core().blockNum; }

}  // namespace AscendC

#endif  // LYNX_EMU_BASE_H
