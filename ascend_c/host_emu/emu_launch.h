/*
 * Host emulation of a kernel launch: kernel<<<blockDim, nullptr, stream>>>(args...) runs the
 * kernel body once per block index, each with its own Unified Buffer. Blocks run one after the
 * other (optionally in reverse order), so results that depend on block order or count show up.
 */
#ifndef LYNX_EMU_LAUNCH_H
#define LYNX_EMU_LAUNCH_H

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "emu_base.h"

namespace AscendC {

struct EmuLaunchStats {
    uint32_t ubPeak = 0;  // largest Unified Buffer footprint of any block
};

template <typename F>
inline EmuLaunchStats EmuLaunch(uint32_t blockDim, bool reverse, F&& body)
{
    if (blockDim == 0 || blockDim > 65535) EmuFail("blockDim must be in [1, 65535]");
    std::unique_ptr<uint8_t, decltype(&std::free)> ub(
        static_cast<uint8_t*>(std::aligned_alloc(ONE_BLK_SIZE, UB_BYTES)), &std::free);
    EmuLaunchStats stats;
    for (uint32_t k = 0; k < blockDim; ++k) {
        EmuCore core;
        core.blockIdx = reverse ? blockDim - 1 - k : k;
        core.blockNum = blockDim;
        core.ub = ub.get();
        g_emuCore = &core;
        try {
            body();
        } catch (...) {
            g_emuCore = nullptr;
            throw;
        }
        g_emuCore = nullptr;
        if (!core.deferredError.empty()) EmuFail(core.deferredError);
        stats.ubPeak = std::max(stats.ubPeak, core.ubPeak);
    }
    return stats;
}

}  // namespace AscendC

#endif  // LYNX_EMU_LAUNCH_H
