/*
 * Helpers shared by the torch operator files of the Lynx kernels: codec arguments -> tiling.
 * Needs only PyTorch (ATen), so the schema + Meta file builds without CANN.
 */
#ifndef LYNX_OP_COMMON_H
#define LYNX_OP_COMMON_H

#include <string>

#include <ATen/ATen.h>

#include "lynx_tiling_host.h"

namespace lynx_ascend {

inline LynxTilingArgs Args(int64_t h, int64_t t, int64_t d, int64_t pageSize, int64_t chunkSize, int64_t vChunkSize,
                           int64_t anchorBits, int64_t vAnchorBits, int64_t kAxis, int64_t vAxis, int64_t numSink,
                           uint32_t mode)
{
    TORCH_CHECK(h > 0 && t > 0 && d > 0 && h < (1 << 20) && t < (1ll << 31) && d < (1 << 16),
                "lynx_ascend: bad layer shape [", h, ", ", t, ", ", d, "]");
    TORCH_CHECK(pageSize > 0 && chunkSize > 0 && vChunkSize > 0 && numSink >= 0 && anchorBits > 0 && vAnchorBits > 0,
                "lynx_ascend: bad codec parameters page_size=", pageSize, " chunk_size=", chunkSize,
                " v_chunk_size=", vChunkSize, " anchor_bits=", anchorBits, " v_anchor_bits=", vAnchorBits,
                " num_sink_tokens=", numSink);
    LynxTilingArgs a;
    a.numHeads = (uint32_t)h;
    a.numTokens = (uint32_t)t;
    a.headDim = (uint32_t)d;
    a.dtypeBytes = 2;
    a.pageSize = (uint32_t)pageSize;
    a.chunkSize[0] = (uint32_t)chunkSize;
    a.chunkSize[1] = (uint32_t)vChunkSize;
    a.anchorBits[0] = (uint32_t)anchorBits;
    a.anchorBits[1] = (uint32_t)vAnchorBits;
    a.axis[0] = (uint32_t)kAxis;
    a.axis[1] = (uint32_t)vAxis;
    a.numSinkTokens = (uint32_t)numSink;
    a.mode = mode;
    return a;
}

// LynxConfig.center as the compress op's `center` argument: 0 = mean, 1 = midrange.
inline uint32_t Center(int64_t center)
{
    TORCH_CHECK(center == LYNX_CENTER_MEAN || center == LYNX_CENTER_MIDRANGE, "lynx_ascend: center=", center,
                " must be 0 (mean) or 1 (midrange)");
    return (uint32_t)center;
}

// LynxConfig.scalar_grid as the compress op's `scalar_grid` argument: 0 = float16, 1 = byte.
inline uint32_t ScalarGrid(int64_t grid)
{
    TORCH_CHECK(grid == LYNX_GRID_FLOAT16 || grid == LYNX_GRID_BYTE, "lynx_ascend: scalar_grid=", grid,
                " must be 0 (float16) or 1 (byte)");
    return (uint32_t)grid;
}

// The compress op's `sigma_levels`: the byte grid's float32 [256] table (lynx_tables.sigma_levels,
// ascend_c_host.kernel_tables(cfg, "k", "sigma_levels")); required on the byte grid, unused (may be
// None) on the float16 grid. True when the kernel reads it.
inline bool CheckSigmaLevels(const c10::optional<at::Tensor>& levels, uint32_t grid)
{
    if (grid != LYNX_GRID_BYTE) return false;
    TORCH_CHECK(levels.has_value() && levels->defined(), "lynx_ascend.compress: scalar_grid=1 (byte) needs the ",
                "sigma_levels table");
    const at::Tensor& x = *levels;
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 1 && x.numel() == LYNX_SIGMA_TABLE_SIZE &&
                    x.is_contiguous(),
                "lynx_ascend: sigma_levels must be a contiguous float32 [", LYNX_SIGMA_TABLE_SIZE, "] table");
    return true;
}

inline LynxTiling Tiling(const LynxTilingArgs& a)
{
    LynxTiling t;
    const std::string err = LynxComputeTiling(a, t);
    TORCH_CHECK(err.empty(), "lynx_ascend: ", err);
    return t;
}

inline bool IsBf16(const at::ScalarType s)
{
    TORCH_CHECK(s == at::kHalf || s == at::kBFloat16, "lynx_ascend: KV must be float16 or bfloat16, got ", s);
    return s == at::kBFloat16;
}

}  // namespace lynx_ascend

#endif  // LYNX_OP_COMMON_H
