/*
 * Tiling of the Lynx Ascend C kernels: a plain struct shared by the host (which fills it in
 * lynx_tiling_host.cpp) and the AI Vector cores (which copy it from GM at start-up).
 *
 * Work decomposition: one work item is (page, K|V, kv_head); items are numbered
 *   item = (page * 2 + kv) * numHeads + head
 * and each core takes a contiguous range of them (GetBlockIdx / GetBlockNum), so the bytes a
 * page produces never depend on how many cores ran. Inside an item the page's rows (tokens of
 * one head, each headDim wide) are processed in row blocks of rowsPerBlock[kv] rows that the
 * TQue pipeline double-buffers; the quantization itself runs over sub-blocks of subBlock values.
 *
 * Byte layout: wire format v1 (lynx_npu/codec/lynx_layout.py). Pages differ in shape only as
 * page 0 (carries the sinks), full middle pages, and the ragged last page, so three
 * LynxPageKind records describe every page of a layer.
 */
#ifndef LYNX_TILING_H
#define LYNX_TILING_H

#include <cstddef>
#include <cstdint>

// Device code (the CANN compiler defines __CCE_AICORE__) needs __aicore__ on every function;
// host code, the g++ host build included, sees plain inline functions.
#if defined(__CCE_AICORE__)
#define LYNX_INLINE __aicore__ inline
#else
#define LYNX_INLINE inline
#endif

constexpr uint32_t LYNX_ALIGN = 32;          // bytes: section alignment and UB block size
constexpr uint32_t LYNX_TABLE_SIZE = 128;    // entries: thresholds / split thresholds padded to a power of 2
                                             // (+inf); magnitudes: exactly 2^(a-1+r) = 128 for a + r = 8
// 128-entry tables in the Unified Buffer: compress holds K's and V's thresholds and end-cell split
// thresholds (lynx_tables.thresholds / split_thresholds), decompress K's and V's magnitudes
// (lynx_tables.magnitudes, read at (m << r) | residual field)
constexpr uint32_t LYNX_COMPRESS_TABLES = 4;
constexpr uint32_t LYNX_DECOMPRESS_TABLES = 2;
constexpr uint32_t LYNX_SIGMA_TABLE_SIZE = 256;  // entries: the byte grid's sigma levels (lynx_tables.sigma_levels)
constexpr uint32_t LYNX_NUM_SECTIONS = 10;
constexpr uint32_t LYNX_NUM_KINDS = 3;
// Code streams (K anchor, K residual, V anchor, V residual) and the 32-byte blocks of per-lane
// constants each needs to pack (compress) or unpack (decompress) its codes (lynx_kernel_common.h).
constexpr uint32_t LYNX_CODE_STREAMS = 4;
constexpr uint32_t LYNX_PACK_PATTERNS = 1;
constexpr uint32_t LYNX_UNPACK_PATTERNS = 3;

enum LynxSection : uint32_t {
    LYNX_K_CODES = 0,  // anchor buffer: packed anchor codes of K, [H, Tp, D]
    LYNX_V_CODES = 1,
    LYNX_K_GAMMA = 2,  // anchor buffer: [2, H*D] KV dtype, page min then page max
    LYNX_V_GAMMA = 3,
    LYNX_K_STATS = 4,  // anchor buffer: [2, num_chunks] float16, mu then sigma
    LYNX_V_STATS = 5,
    LYNX_K_SINK = 6,   // anchor buffer: [H, num_sink, D] KV dtype, page 0 only
    LYNX_V_SINK = 7,
    LYNX_K_RES = 8,    // residual buffer: packed residual codes of K, [H, Tp, D]
    LYNX_V_RES = 9,
};

enum LynxAxis : uint32_t {
    LYNX_AXIS_CHANNEL = 0,  // a chunk is C tokens of one channel: stats [H, ceil(Tp/C), D]
    LYNX_AXIS_TOKEN = 1,    // a chunk is C head_dim values of one token: stats [H, Tp, D/C]
};

enum LynxCenter : uint32_t {
    LYNX_CENTER_MEAN = 0,      // mu = f16(pairwise-tree sum / count): the paper's
    LYNX_CENTER_MIDRANGE = 1,  // mu = f16((max + min) / 2): LynxConfig's default
};

enum LynxScalarGrid : uint32_t {
    LYNX_GRID_FLOAT16 = 0,  // mu = f16(centre), sigma = f16(max |xc|): any float16 (the paper's)
    LYNX_GRID_BYTE = 1,     // mu = u / 256, sigma = the smallest of 256 levels >= max |xc| (lynx_tables.py)
};

enum LynxPageKindId : uint32_t {
    LYNX_KIND_FIRST = 0,  // page 0: sinks + the first body tokens
    LYNX_KIND_MID = 1,    // full pages of pageSize tokens
    LYNX_KIND_LAST = 2,   // the ragged last page (same as MID when the body divides evenly)
};

enum LynxMode : uint32_t {
    LYNX_MODE_COMPRESS = 0,
    LYNX_MODE_DECOMPRESS = 1,        // into dense K, V of [H, T, D]
    LYNX_MODE_DECOMPRESS_PAGED = 2,  // into vLLM-Ascend caches [num_blocks, block_size, H, D]
};

struct LynxPageKind {
    uint32_t numTokens;                     // Tp: body tokens quantized in this page
    uint32_t numSink;                       // exact sink tokens carried (page 0 only)
    uint32_t numChunks[2];                  // K, V chunks of the whole page (all heads)
    uint64_t offset[LYNX_NUM_SECTIONS];     // bytes from the page's anchor (or residual) start
    uint64_t anchorBytes;                   // this page's anchor buffer
    uint64_t residualBytes;                 // this page's residual buffer
};

struct LynxTiling {
    // shapes
    uint32_t numHeads;       // H: kv heads of the layer
    uint32_t headDim;        // D: values per token per head (multiple of 16)
    uint32_t numTokens;      // T: tokens of the layer
    uint32_t dtypeBytes;     // 2: float16 or bfloat16 KV
    // codec
    uint32_t pageSize;       // P: body tokens per page
    uint32_t chunkSize[2];   // C of K, V: values per chunk
    uint32_t tokenChunk[2];  // values per token-axis chunk of K, V: C, or headDim when smaller
    uint32_t numSink;        // sink tokens of the layer (min(num_sink_tokens, T))
    uint32_t numPages;
    uint32_t axis[2];        // LynxAxis of K, V
    uint32_t center;         // LynxCenter of the chunk centre mu (compress only)
    uint32_t scalarGrid;     // LynxScalarGrid of the chunk scalars mu, sigma (compress only)
    uint32_t anchorBits[2];  // a of K, V: bits of an anchor code (2..7)
    uint32_t residualBits[2];  // r = 8 - a of K, V
    uint32_t yMax[2];        // largest magnitude code of K, V: (2^(a-1) - 1) << r (112 for 4 + 4)
    uint32_t bias[2];        // round-half-down bias of K's, V's split: 2^(r-1) - 1 (7 for 4 + 4)
    uint32_t tableSize;      // LYNX_TABLE_SIZE
    uint32_t sigmaTableSize; // LYNX_SIGMA_TABLE_SIZE (compress on the byte grid reads the sigma levels)
    // work split and buffers
    uint32_t mode;           // LynxMode
    uint32_t useResidual;    // decompress: 1 = full stage, 0 = anchor only
    uint32_t numWork;        // numPages * 2 * numHeads
    uint32_t rowsPerBlock[2];  // rows (tokens) per pipelined block of K, V (whole chunks)
    uint32_t maxBlockRows;   // max(rowsPerBlock): the buffers hold the larger block
    uint32_t blockElems;     // maxBlockRows * headDim rounded up to 64 (one 256-byte repeat)
    uint32_t subBlock;       // values per quantization sub-block (multiple of 64)
    uint32_t maxStats;       // chunk statistics per row block of K or V (upper bound, multiple of 64)
    uint32_t dimPad;         // headDim rounded up to 64
    uint32_t sinkRows;       // sink rows moved per copy
    uint32_t ubBytes;        // Unified Buffer bytes the buffers below were sized for
    uint32_t ubUsed;         // bytes the kernel's TPipe allocates (<= ubBytes)
    // paged output (decompress into vLLM-Ascend caches)
    uint32_t blockSize;      // tokens per cache block
    uint32_t slotBytes;      // 4 (int32) or 8 (int64) slot_mapping entries
    uint64_t numSlots;       // num_blocks * block_size: slots >= this are skipped
    // layout
    LynxPageKind kind[LYNX_NUM_KINDS];
    uint64_t anchorTotal;    // bytes of every page's anchor buffer back to back
    uint64_t residualTotal;
};

// No implicit padding before numSlots: host and device compilers see one layout.
static_assert(offsetof(LynxTiling, numSlots) % 8 == 0, "LynxTiling: numSlots is not 8-byte aligned");

// Bytes of one code buffer for `elems` values: sized for the wider of K's and V's codes
// (anchor codes, or residual codes), since K and V items share the buffers.
LYNX_INLINE uint32_t LynxCodeBytes(const LynxTiling& t, uint32_t elems, bool residual)
{
    const uint32_t* bits = residual ? t.residualBits : t.anchorBits;
    return elems * (bits[0] > bits[1] ? bits[0] : bits[1]) / 8;
}

// Page i's kind and the byte offsets of its buffers within the layer's streams.
LYNX_INLINE uint32_t LynxKindOf(const LynxTiling& t, uint32_t page)
{
    if (page == 0) return LYNX_KIND_FIRST;
    return page + 1 == t.numPages ? LYNX_KIND_LAST : LYNX_KIND_MID;
}

LYNX_INLINE uint64_t LynxAnchorBase(const LynxTiling& t, uint32_t page)
{
    return page == 0 ? 0 : t.kind[LYNX_KIND_FIRST].anchorBytes +
                           (uint64_t)(page - 1) * t.kind[LYNX_KIND_MID].anchorBytes;
}

LYNX_INLINE uint64_t LynxResidualBase(const LynxTiling& t, uint32_t page)
{
    return page == 0 ? 0 : t.kind[LYNX_KIND_FIRST].residualBytes +
                           (uint64_t)(page - 1) * t.kind[LYNX_KIND_MID].residualBytes;
}

LYNX_INLINE uint32_t LynxAlign32(uint32_t bytes)
{
    return (bytes + LYNX_ALIGN - 1) / LYNX_ALIGN * LYNX_ALIGN;
}

LYNX_INLINE uint32_t LynxRoundUp(uint32_t n, uint32_t m)
{
    return (n + m - 1) / m * m;
}

// First layer token quantized by page i (pages cut the body that follows the sinks).
LYNX_INLINE uint32_t LynxBodyStart(const LynxTiling& t, uint32_t page)
{
    return t.numSink + page * t.pageSize;
}

#endif  // LYNX_TILING_H
