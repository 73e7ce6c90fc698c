/*
 * Host-side tiling of the Lynx kernels: validates the request and fills LynxTiling
 * (kernels/lynx_tiling.h). Used by the torch_npu launcher and by the g++ host build alike, so
 * both run the kernels with the same tiling.
 */
#ifndef LYNX_TILING_HOST_H
#define LYNX_TILING_HOST_H

#include <string>

#include "../kernels/lynx_tiling.h"

struct LynxTilingArgs {
    uint32_t numHeads = 0;       // H
    uint32_t numTokens = 0;      // T
    uint32_t headDim = 0;        // D
    uint32_t dtypeBytes = 2;     // float16 / bfloat16
    uint32_t pageSize = 256;     // LynxConfig.page_size
    uint32_t chunkSize[2] = {32, 32};  // LynxConfig.chunk_size, v_chunk_size (cfg.chunk("k"), ("v"))
    uint32_t anchorBits[2] = {4, 4};  // LynxConfig.anchor_bits, v_anchor_bits (cfg.bits("k"), ("v"))
    uint32_t axis[2] = {LYNX_AXIS_CHANNEL, LYNX_AXIS_TOKEN};
    uint32_t numSinkTokens = 4;  // LynxConfig.num_sink_tokens
    uint32_t center = LYNX_CENTER_MIDRANGE;  // LynxConfig.center (compress; decompress ignores it)
    uint32_t scalarGrid = LYNX_GRID_FLOAT16; // LynxConfig.scalar_grid (compress; decompress ignores it)
    uint32_t mode = LYNX_MODE_COMPRESS;
    uint32_t useResidual = 1;    // decompress: full stage
    uint32_t blockSize = 0;      // paged decompress: tokens per cache block
    uint32_t slotBytes = 8;      // paged decompress: 4 (int32) or 8 (int64) slot_mapping
    uint64_t numSlots = 0;       // paged decompress: num_blocks * block_size
    uint32_t ubBytes = 0;        // Unified Buffer bytes per core; 0 = 192 KiB (Atlas A2 AIV)
};

constexpr uint32_t LYNX_UB_BYTES_A2 = 192 * 1024;

// Fills `t`. Returns "" on success, otherwise why the request is unsupported (naming the value).
std::string LynxComputeTiling(const LynxTilingArgs& args, LynxTiling& t);

// Unified Buffer bytes the kernel for t.mode allocates with `bufferNum` buffers per pipelined
// queue (mirrors the kernels' Init(); the host build checks the two agree).
uint32_t LynxUbBytes(const LynxTiling& t, uint32_t bufferNum);

// Buffers per pipelined queue the tiling is sized for (the kernels' BUFFER_NUM).
constexpr uint32_t LYNX_TILING_BUFFER_NUM = 2;

#endif  // LYNX_TILING_HOST_H
