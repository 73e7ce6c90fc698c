/*
 * Host tiling of the Lynx kernels. The page byte layout computed here is wire format v1 and
 * must equal lynx_npu/codec/lynx_layout.py (tests/ascend_c/test_tiling.py checks it).
 */
#include "lynx_tiling_host.h"

#include <algorithm>
#include <cstring>

namespace {

constexpr uint32_t kSubBlockMax = 2048;  // values per quantization sub-block
constexpr uint32_t kMaxRows = 512;       // rows per pipelined block, upper bound
constexpr uint32_t kRepeatElems = 64;    // float32 values in one 256-byte vector repeat
constexpr uint32_t kRowUnit = 8;         // block rows step of a token-axis tensor (chunks within a row)
const char* const kChunkName[2] = {"chunk_size", "v_chunk_size"};  // LynxConfig fields
const char* const kAxisName[2] = {"k_axis", "v_axis"};
const char* const kBitsName[2] = {"anchor_bits", "v_anchor_bits"};

uint64_t Align(uint64_t n) { return (n + LYNX_ALIGN - 1) / LYNX_ALIGN * LYNX_ALIGN; }
uint32_t CeilDiv(uint64_t a, uint64_t b) { return (uint32_t)((a + b - 1) / b); }

uint64_t NumChunks(uint32_t axis, uint32_t h, uint32_t tp, uint32_t d, uint32_t c)
{
    if (axis == LYNX_AXIS_CHANNEL) return (uint64_t)h * CeilDiv(tp, c) * d;
    return (uint64_t)h * tp * CeilDiv(d, c);
}

// lynx_layout._sections: each section starts at the previous end rounded up to 32 bytes; the
// buffer ends where its last section ends.
void Sections(const uint64_t* sizes, const uint32_t* ids, uint32_t n, LynxPageKind& k, uint64_t& end)
{
    uint64_t off = 0;
    for (uint32_t i = 0; i < n; ++i) {
        k.offset[ids[i]] = off;
        off = Align(off + sizes[i]);
    }
    end = n ? k.offset[ids[n - 1]] + sizes[n - 1] : 0;
}

void PageKind(const LynxTilingArgs& a, uint32_t tp, uint32_t ns, LynxPageKind& k)
{
    std::memset(&k, 0, sizeof(k));
    k.numTokens = tp;
    k.numSink = ns;
    const uint64_t h = a.numHeads, d = a.headDim, es = a.dtypeBytes;
    const uint64_t n = h * tp * d;
    uint64_t codes[2], res[2];  // K's and V's packed codes, each of its own split
    for (uint32_t kv = 0; kv < 2; ++kv) {
        codes[kv] = (n * a.anchorBits[kv] + 7) / 8;
        res[kv] = (n * (8 - a.anchorBits[kv]) + 7) / 8;
    }
    const uint64_t gamma = tp ? 2 * h * d * es : 0;
    for (uint32_t kv = 0; kv < 2; ++kv)
        k.numChunks[kv] = (uint32_t)NumChunks(a.axis[kv], a.numHeads, tp, a.headDim, a.chunkSize[kv]);
    uint64_t sizes[8] = {codes[0], codes[1], gamma, gamma, 2ull * k.numChunks[0] * 2, 2ull * k.numChunks[1] * 2,
                         h * ns * d * es, h * ns * d * es};
    uint32_t ids[8] = {LYNX_K_CODES, LYNX_V_CODES, LYNX_K_GAMMA, LYNX_V_GAMMA, LYNX_K_STATS, LYNX_V_STATS,
                       LYNX_K_SINK, LYNX_V_SINK};
    Sections(sizes, ids, ns ? 8 : 6, k, k.anchorBytes);
    uint64_t rsizes[2] = {res[0], res[1]};
    uint32_t rids[2] = {LYNX_K_RES, LYNX_V_RES};
    Sections(rsizes, rids, 2, k, k.residualBytes);
}

// Chunk statistics one block of `rows` rows produces for one of K / V.
uint32_t StatsPerBlock(uint32_t axis, uint32_t rows, uint32_t d, uint32_t c)
{
    return axis == LYNX_AXIS_CHANNEL ? CeilDiv(rows, c) * d : rows * CeilDiv(d, c);
}

// One set of buffers serves K and V items alike: sized for the larger block and statistics.
void SizeBuffers(LynxTiling& t, const uint32_t rows[2])
{
    const uint32_t d = t.headDim;
    uint32_t stats = 0;
    for (uint32_t kv = 0; kv < 2; ++kv) {
        t.rowsPerBlock[kv] = rows[kv];
        stats = std::max(stats, StatsPerBlock(t.axis[kv], rows[kv], d, t.chunkSize[kv]));
    }
    t.maxBlockRows = std::max(rows[0], rows[1]);
    t.blockElems = LynxRoundUp(t.maxBlockRows * d, kRepeatElems);
    t.subBlock = std::min(kSubBlockMax, t.blockElems);
    t.maxStats = LynxRoundUp(stats, kRepeatElems);
    t.dimPad = LynxRoundUp(d, kRepeatElems);
}

std::string Check(const LynxTilingArgs& a)
{
    auto s = [](const char* name, uint64_t v) { return std::string(name) + "=" + std::to_string(v); };
    if (a.numHeads == 0 || a.numTokens == 0 || a.headDim == 0) return "empty layer: " + s("numHeads", a.numHeads) +
        ", " + s("numTokens", a.numTokens) + ", " + s("headDim", a.headDim);
    if (a.dtypeBytes != 2) return s("dtypeBytes", a.dtypeBytes) + " unsupported: the kernels take float16 or bfloat16 KV";
    for (uint32_t kv = 0; kv < 2; ++kv)  // K and V each split by their own anchor bits
        if (a.anchorBits[kv] < 2 || a.anchorBits[kv] > 7)
            return s(kBitsName[kv], a.anchorBits[kv]) + " must be in [2, 7] (the residual holds the rest of 8 bits)";
    if (a.headDim % 16) return s("head_dim", a.headDim) + " must be a multiple of 16 (32-byte rows for DataCopy)";
    if (a.headDim > 2040) return s("head_dim", a.headDim) + " must be <= 2040 (repeat strides are 8-bit)";
    if (a.pageSize == 0) return s("page_size", a.pageSize) + " must be >= 1";
    for (uint32_t kv = 0; kv < 2; ++kv) {  // K and V each chunk by their own size and axis
        const uint32_t c = a.chunkSize[kv];
        const std::string cs = s(kChunkName[kv], c);
        if (a.axis[kv] != LYNX_AXIS_TOKEN && a.axis[kv] != LYNX_AXIS_CHANNEL)
            return s(kAxisName[kv], a.axis[kv]) + " unknown (0 = channel, 1 = token)";
        if (c == 0 || c % 8) return cs + " must be a multiple of 8 (whole 32-byte float blocks)";
        if (a.axis[kv] == LYNX_AXIS_TOKEN) {
            // every row splits into equal chunks: D % C == 0, or one chunk of D values (D < C)
            const uint32_t w = std::min(c, a.headDim);
            if (a.headDim % w) return s("head_dim", a.headDim) + " must be a multiple of " + cs + " (or smaller) for a token-axis chunk";
            if (w > 64) return cs + " must be <= 64 for a token-axis chunk (one vector repeat)";
        } else if (a.pageSize % c) {
            return s("page_size", a.pageSize) + " must be a multiple of " + cs + " for a channel-axis chunk";
        }
    }
    if (a.center > LYNX_CENTER_MIDRANGE) return s("center", a.center) + " unknown (0 = mean, 1 = midrange)";
    if (a.scalarGrid > LYNX_GRID_BYTE) return s("scalar_grid", a.scalarGrid) + " unknown (0 = float16, 1 = byte)";
    if (a.mode > LYNX_MODE_DECOMPRESS_PAGED) return s("mode", a.mode) + " unknown";
    if (a.mode == LYNX_MODE_DECOMPRESS_PAGED) {
        if (a.blockSize == 0) return s("block_size", a.blockSize) + " must be >= 1";
        if (a.slotBytes != 4 && a.slotBytes != 8) return s("slot_mapping element bytes", a.slotBytes) + " must be 4 or 8";
    }
    return "";
}

}  // namespace

uint32_t LynxUbBytes(const LynxTiling& t, uint32_t bufferNum)
{
    const uint64_t es = t.dtypeBytes, d = t.headDim, np = t.blockElems, sb = t.subBlock;
    const uint64_t stats = t.maxStats;
    const bool token = t.axis[0] == LYNX_AXIS_TOKEN || t.axis[1] == LYNX_AXIS_TOKEN;
    uint64_t q = 0, c = 0;  // queue buffers, calculation buffers
    const bool sigmaTable = t.mode == LYNX_MODE_COMPRESS && t.scalarGrid == LYNX_GRID_BYTE;
    // 128-entry tables: compress K's and V's thresholds and end-cell split thresholds, then (byte
    // grid) the sigma levels; decompress K's and V's magnitudes
    const uint64_t tables = t.mode == LYNX_MODE_COMPRESS ? LYNX_COMPRESS_TABLES : LYNX_DECOMPRESS_TABLES;
    q += Align((tables * LYNX_TABLE_SIZE + (sigmaTable ? LYNX_SIGMA_TABLE_SIZE : 0)) * 4);
    if (t.numSink) q += bufferNum * Align((uint64_t)t.sinkRows * d * es);  // sink pass-through
    if (t.mode == LYNX_MODE_COMPRESS) {
        q += bufferNum * Align((uint64_t)t.maxBlockRows * d * es);   // KV rows in
        q += bufferNum * Align(LynxCodeBytes(t, np, false));         // anchor codes out
        q += bufferNum * Align(LynxCodeBytes(t, np, true));          // residual codes out
        q += bufferNum * Align(stats * 2 * 2);                       // mu, sigma out (float16)
        q += Align(2 * d * es);                                      // gamma out
        c += 2 * Align(np * 4);                                      // x, work
        c += 4 * Align(stats * 4);                                   // sums, counts, mu, sigma
        if (token) c += Align(stats * 8 * 4);                        // per-chunk broadcast blocks
        c += 3 * Align(t.dimPad * 4) + Align(t.dimPad / 8);          // gmin, gmax, scale, mask
        c += 3 * Align(sb * 4) + Align(sb * 4) + Align(sb / 8);      // sub-block temps, offsets, mask
        c += Align(stats / 8);                                       // sigma > 0 mask
        c += Align(LYNX_CODE_STREAMS * LYNX_PACK_PATTERNS * LYNX_ALIGN);    // bit-lane patterns
    } else {
        q += bufferNum * Align(LynxCodeBytes(t, np, false));         // anchor codes in
        if (t.useResidual) q += bufferNum * Align(LynxCodeBytes(t, np, true));  // residual codes in
        q += bufferNum * Align(stats * 2 * 2);                       // mu, sigma in
        q += Align(2 * d * es);                                      // gamma in
        q += bufferNum * Align((uint64_t)t.maxBlockRows * d * es);   // KV rows out
        c += Align(np * 4);                                          // x
        c += 2 * Align(stats * 4);                                   // mu, sigma
        if (token) c += Align(stats * 8 * 4);                        // per-chunk broadcast blocks
        c += 2 * Align(t.dimPad * 4);                                // gmin, scale
        c += 4 * Align(sb * 4) + Align(sb * 4) + Align(sb * 2);      // temps, offsets, halves
        c += Align(sb * 4) + 2 * Align(sb / 8);                      // group offsets, sign / odd-lane masks
        c += Align(LYNX_CODE_STREAMS * LYNX_UNPACK_PATTERNS * LYNX_ALIGN);  // bit-lane patterns
    }
    return (uint32_t)(q + c);
}

std::string LynxComputeTiling(const LynxTilingArgs& a, LynxTiling& t)
{
    std::memset(&t, 0, sizeof(t));
    std::string err = Check(a);
    if (!err.empty()) return err;
    t.numHeads = a.numHeads;
    t.headDim = a.headDim;
    t.numTokens = a.numTokens;
    t.dtypeBytes = a.dtypeBytes;
    t.pageSize = a.pageSize;
    for (uint32_t kv = 0; kv < 2; ++kv) {
        t.chunkSize[kv] = a.chunkSize[kv];
        t.tokenChunk[kv] = std::min(a.chunkSize[kv], a.headDim);
        t.axis[kv] = a.axis[kv];
    }
    t.center = a.center;
    t.scalarGrid = a.scalarGrid;
    for (uint32_t kv = 0; kv < 2; ++kv) {  // LynxConfig.bits / residual_bits / y_max / bias of K, V
        t.anchorBits[kv] = a.anchorBits[kv];
        t.residualBits[kv] = 8 - a.anchorBits[kv];
        t.yMax[kv] = ((1u << (a.anchorBits[kv] - 1)) - 1) << t.residualBits[kv];
        t.bias[kv] = (1u << (t.residualBits[kv] - 1)) - 1;
    }
    t.tableSize = LYNX_TABLE_SIZE;
    t.sigmaTableSize = LYNX_SIGMA_TABLE_SIZE;
    t.mode = a.mode;
    t.useResidual = a.mode == LYNX_MODE_COMPRESS ? 1 : a.useResidual;
    t.blockSize = a.blockSize;
    t.slotBytes = a.slotBytes;
    t.numSlots = a.numSlots;
    t.ubBytes = a.ubBytes ? a.ubBytes : LYNX_UB_BYTES_A2;

    // pages (lynx_layout.page_spans): page 0 = the sinks + the first body tokens
    const uint32_t ns = std::min(a.numSinkTokens, a.numTokens);
    const uint32_t body = a.numTokens - ns;
    t.numSink = ns;
    t.numPages = body ? CeilDiv(body, a.pageSize) : 1;
    const uint32_t tpFirst = std::min(a.pageSize, body);
    const uint32_t tpLast = t.numPages > 1 ? body - (t.numPages - 1) * a.pageSize : tpFirst;
    PageKind(a, tpFirst, ns, t.kind[LYNX_KIND_FIRST]);
    PageKind(a, a.pageSize, 0, t.kind[LYNX_KIND_MID]);
    if (t.numPages > 1) PageKind(a, tpLast, 0, t.kind[LYNX_KIND_LAST]);
    else t.kind[LYNX_KIND_LAST] = t.kind[LYNX_KIND_FIRST];
    t.anchorTotal = LynxAnchorBase(t, t.numPages - 1) + t.kind[LynxKindOf(t, t.numPages - 1)].anchorBytes;
    t.residualTotal = LynxResidualBase(t, t.numPages - 1) + t.kind[LynxKindOf(t, t.numPages - 1)].residualBytes;
    t.numWork = t.numPages * 2 * a.numHeads;

    // sinks move through the Unified Buffer in pieces of at most 8 KiB
    t.sinkRows = ns ? std::max(1u, std::min(ns, 8192u / (a.headDim * a.dtypeBytes))) : 0;

    // The largest row blocks that fit. A block holds whole chunks, so a channel-axis tensor's
    // block is a multiple of its chunk (C tokens), a token-axis one's of kRowUnit; each of K, V
    // rounds the candidate `rows` down to its own unit.
    const uint32_t tpMax = std::max(1u, std::max(tpFirst, std::min(a.pageSize, body)));
    uint32_t unit[2], cap[2], blockRows[2];
    for (uint32_t kv = 0; kv < 2; ++kv) {
        unit[kv] = a.axis[kv] == LYNX_AXIS_CHANNEL ? a.chunkSize[kv] : kRowUnit;
        cap[kv] = std::min(LynxRoundUp(tpMax, unit[kv]), LynxRoundUp(kMaxRows, unit[kv]));
    }
    const uint32_t coarse = unit[1] > unit[0] ? 1 : 0;  // one block of its unit: the smallest plan
    uint32_t rows = std::max(cap[0], cap[1]);
    for (; rows >= unit[coarse]; rows -= kRowUnit) {  // units are multiples of kRowUnit
        for (uint32_t kv = 0; kv < 2; ++kv) blockRows[kv] = std::min(cap[kv], rows / unit[kv] * unit[kv]);
        SizeBuffers(t, blockRows);
        if (LynxUbBytes(t, LYNX_TILING_BUFFER_NUM) <= t.ubBytes) break;
    }
    if (rows < unit[coarse]) return "head_dim=" + std::to_string(a.headDim) + " with " + kChunkName[coarse] + "=" +
                                    std::to_string(a.chunkSize[coarse]) + " does not fit the " +
                                    std::to_string(t.ubBytes) + "-byte Unified Buffer";
    t.ubUsed = LynxUbBytes(t, LYNX_TILING_BUFFER_NUM);
    return "";
}
