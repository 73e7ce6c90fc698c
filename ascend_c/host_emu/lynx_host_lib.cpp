/*
 * The g++ host build of the Lynx kernels: the kernel sources compiled against the host
 * emulation of the Ascend C API (this directory), behind a C ABI for ctypes
 * (lynx_npu/ops/ascend_c_host.py). "Launching" runs the kernel body once per block index.
 * This checks the kernels' logic and their use of the API; it is not hardware validation.
 */
#include <cstdio>
#include <string>

#include "../host/lynx_tiling_host.h"
#include "../kernels/lynx_compress.cpp"
#include "../kernels/lynx_decompress.cpp"

namespace {

int Fail(char* err, uint32_t errLen, const std::string& msg)
{
    if (err && errLen) std::snprintf(err, errLen, "%s", msg.c_str());
    return 1;
}

// Runs `body` on blockDim emulated cores and checks the Unified Buffer the kernel allocated
// against the tiling's plan for this build's BUFFER_NUM.
template <typename F>
int Launch(uint32_t blockDim, int reverse, const LynxTiling& t, uint32_t* ubPeak, char* err, uint32_t errLen, F&& body)
{
    try {
        AscendC::EmuLaunchStats s = AscendC::EmuLaunch(blockDim, reverse != 0, body);
        if (ubPeak) *ubPeak = s.ubPeak;
        const uint32_t plan = LynxUbBytes(t, LYNX_BUFFER_NUM);
        if (s.ubPeak != plan)
            return Fail(err, errLen, "kernel allocated " + std::to_string(s.ubPeak) +
                                     " Unified Buffer bytes, the tiling planned " + std::to_string(plan));
        return 0;
    } catch (const std::exception& e) {
        return Fail(err, errLen, e.what());
    }
}

}  // namespace

extern "C" {

uint32_t lynx_host_buffer_num() { return LYNX_BUFFER_NUM; }
uint32_t lynx_host_tiling_bytes() { return sizeof(LynxTiling); }

int lynx_host_tiling(uint32_t numHeads, uint32_t numTokens, uint32_t headDim, uint32_t dtypeBytes,
                     uint32_t pageSize, uint32_t kChunkSize, uint32_t vChunkSize, uint32_t kAnchorBits,
                     uint32_t vAnchorBits, uint32_t kAxis, uint32_t vAxis, uint32_t numSinkTokens, uint32_t center,
                     uint32_t scalarGrid, uint32_t mode, uint32_t useResidual, uint32_t blockSize, uint32_t slotBytes, uint64_t numSlots,
                     uint32_t ubBytes, void* tilingOut, char* err, uint32_t errLen)
{
    LynxTilingArgs a;
    a.numHeads = numHeads;
    a.numTokens = numTokens;
    a.headDim = headDim;
    a.dtypeBytes = dtypeBytes;
    a.pageSize = pageSize;
    a.chunkSize[0] = kChunkSize;
    a.chunkSize[1] = vChunkSize;
    a.anchorBits[0] = kAnchorBits;
    a.anchorBits[1] = vAnchorBits;
    a.axis[0] = kAxis;
    a.axis[1] = vAxis;
    a.numSinkTokens = numSinkTokens;
    a.center = center;
    a.scalarGrid = scalarGrid;
    a.mode = mode;
    a.useResidual = useResidual;
    a.blockSize = blockSize;
    a.slotBytes = slotBytes;
    a.numSlots = numSlots;
    a.ubBytes = ubBytes;
    LynxTiling* t = static_cast<LynxTiling*>(tilingOut);
    std::string msg = LynxComputeTiling(a, *t);
    return msg.empty() ? 0 : Fail(err, errLen, msg);
}

// rowsPerBlock: [K, V, the larger one (what the buffers hold)]; split: [anchor bits, residual
// bits, y_max, bias], each of K then V
void lynx_host_tiling_summary(const void* tiling, uint64_t* anchorTotal, uint64_t* residualTotal,
                              uint32_t* numPages, uint32_t* numWork, uint32_t* ubUsed, uint32_t* rowsPerBlock,
                              uint32_t* split)
{
    const LynxTiling* t = static_cast<const LynxTiling*>(tiling);
    *anchorTotal = t->anchorTotal;
    *residualTotal = t->residualTotal;
    *numPages = t->numPages;
    *numWork = t->numWork;
    *ubUsed = t->ubUsed;
    rowsPerBlock[0] = t->rowsPerBlock[0];
    rowsPerBlock[1] = t->rowsPerBlock[1];
    rowsPerBlock[2] = t->maxBlockRows;
    for (uint32_t kv = 0; kv < 2; ++kv) {
        split[kv] = t->anchorBits[kv];
        split[2 + kv] = t->residualBits[kv];
        split[4 + kv] = t->yMax[kv];
        split[6 + kv] = t->bias[kv];
    }
}

void lynx_host_page_kind(const void* tiling, uint32_t kind, uint32_t* numTokens, uint32_t* numSink,
                         uint64_t* offsets, uint64_t* anchorBytes, uint64_t* residualBytes)
{
    const LynxPageKind& k = static_cast<const LynxTiling*>(tiling)->kind[kind];
    *numTokens = k.numTokens;
    *numSink = k.numSink;
    for (uint32_t i = 0; i < LYNX_NUM_SECTIONS; ++i) offsets[i] = k.offset[i];
    *anchorBytes = k.anchorBytes;
    *residualBytes = k.residualBytes;
}

int lynx_host_compress(int bf16, uint32_t blockDim, int reverse, void* k, void* v, void* kThr, void* vThr,
                       void* kSplit, void* vSplit, void* sigLevels, void* anchor, void* residual, const void* tiling,
                       uint32_t* ubPeak, char* err, uint32_t errLen)
{
    const LynxTiling& t = *static_cast<const LynxTiling*>(tiling);
    if (t.mode != LYNX_MODE_COMPRESS) return Fail(err, errLen, "tiling is not for compress");
    if (t.scalarGrid == LYNX_GRID_BYTE && sigLevels == nullptr)
        return Fail(err, errLen, "scalar_grid=byte needs the sigma level table");
    auto g = [](void* p) { return static_cast<GM_ADDR>(p); };
    GM_ADDR tg = static_cast<GM_ADDR>(const_cast<void*>(tiling));
    return Launch(blockDim, reverse, t, ubPeak, err, errLen, [&] {
        if (bf16)
            lynx_compress_bf16(g(k), g(v), g(kThr), g(vThr), g(kSplit), g(vSplit), g(sigLevels), g(anchor),
                               g(residual), tg);
        else
            lynx_compress_fp16(g(k), g(v), g(kThr), g(vThr), g(kSplit), g(vSplit), g(sigLevels), g(anchor),
                               g(residual), tg);
    });
}

int lynx_host_decompress(int bf16, uint32_t blockDim, int reverse, void* anchor, void* residual, void* kMags,
                         void* vMags, void* kOut, void* vOut, void* slotMapping, const void* tiling,
                         uint32_t* ubPeak, char* err, uint32_t errLen)
{
    const LynxTiling& t = *static_cast<const LynxTiling*>(tiling);
    if (t.mode == LYNX_MODE_COMPRESS) return Fail(err, errLen, "tiling is not for decompress");
    auto g = [](void* p) { return static_cast<GM_ADDR>(p); };
    GM_ADDR tg = static_cast<GM_ADDR>(const_cast<void*>(tiling));
    return Launch(blockDim, reverse, t, ubPeak, err, errLen, [&] {
        if (bf16) lynx_decompress_bf16(g(anchor), g(residual), g(kMags), g(vMags), g(kOut), g(vOut),
                                       g(slotMapping), tg);
        else lynx_decompress_fp16(g(anchor), g(residual), g(kMags), g(vMags), g(kOut), g(vOut),
                                  g(slotMapping), tg);
    });
}

}  // extern "C"
