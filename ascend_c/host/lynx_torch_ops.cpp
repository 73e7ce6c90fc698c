/*
 * NPU (PrivateUse1) implementations of torch.ops.lynx_ascend.* (schema, argument meanings and
 * Meta implementations: lynx_op_schema.cpp). NPU build only: needs CANN and torch_npu.
 * Launches go through torch_npu's OpCommand so they stay ordered with its task queue, as
 * vLLM-Ascend's and LMCache-Ascend's kernels do; block dim = min(AI Vector cores, work items).
 *
 * NOT RUN ON HARDWARE: this file has not been compiled or run against CANN / torch_npu here; the
 * kernels it launches were checked only through the g++ host build (ascend_c/README.md).
 */
#include <algorithm>
#include <cstring>
#include <tuple>

#include <ATen/ATen.h>
#include <torch/library.h>

#include "acl/acl.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/framework/OpCommand.h"

#include "aclrtlaunch_lynx_compress_bf16.h"
#include "aclrtlaunch_lynx_compress_fp16.h"
#include "aclrtlaunch_lynx_decompress_bf16.h"
#include "aclrtlaunch_lynx_decompress_fp16.h"
#include "lynx_op_common.h"

namespace lynx_ascend {
namespace {

at::Tensor TilingOn(const LynxTiling& t, const at::Device& device)
{
    at::Tensor cpu = at::empty({(int64_t)sizeof(LynxTiling)}, at::TensorOptions().dtype(at::kByte));
    std::memcpy(cpu.data_ptr(), &t, sizeof(LynxTiling));
    return cpu.to(device);
}

uint32_t BlockDim(const LynxTiling& t)
{
    int32_t device = 0;
    TORCH_CHECK(aclrtGetDevice(&device) == ACL_SUCCESS, "lynx_ascend: aclrtGetDevice failed");
    int64_t aiv = 0;
    TORCH_CHECK(aclGetDeviceCapability(device, ACL_DEVICE_INFO_VECTOR_CORE_NUM, &aiv) == ACL_SUCCESS && aiv > 0,
                "lynx_ascend: cannot read the AI Vector core count");
    return (uint32_t)std::min<int64_t>(aiv, t.numWork);
}

void CheckTable(const at::Tensor& x, const at::Device& device, const char* name)
{
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 1 && x.numel() == LYNX_TABLE_SIZE && x.is_contiguous(),
                "lynx_ascend: ", name, " must be a contiguous float32 [", LYNX_TABLE_SIZE, "] table");
    TORCH_CHECK(x.device() == device, "lynx_ascend: ", name, " is on ", x.device(), ", expected ", device);
}

void CheckStream(const at::Tensor& x, uint64_t bytes, const at::Device& device, const char* name)
{
    TORCH_CHECK(x.scalar_type() == at::kByte && x.dim() == 1 && x.is_contiguous(),
                "lynx_ascend: ", name, " must be a contiguous 1-D uint8 tensor");
    TORCH_CHECK((uint64_t)x.numel() == bytes, "lynx_ascend: ", name, " has ", x.numel(),
                " bytes; the layout needs ", bytes);
    TORCH_CHECK(x.device() == device, "lynx_ascend: ", name, " is on ", x.device(), ", expected ", device);
}

}  // namespace

// ---- PrivateUse1 (NPU) ----------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> compress_npu(const at::Tensor& k, const at::Tensor& v, const at::Tensor& kThr,
                                                const at::Tensor& vThr, const at::Tensor& kSplit,
                                                const at::Tensor& vSplit, const c10::optional<at::Tensor>& sigLevels,
                                                int64_t pageSize, int64_t chunkSize, int64_t vChunkSize,
                                                int64_t anchorBits, int64_t vAnchorBits, int64_t kAxis, int64_t vAxis,
                                                int64_t numSink, int64_t center, int64_t scalarGrid)
{
    TORCH_CHECK(k.dim() == 3 && k.sizes() == v.sizes() && k.scalar_type() == v.scalar_type(),
                "lynx_ascend.compress: k, v must be [H, T, D] of one shape and dtype");
    TORCH_CHECK(k.device() == v.device(), "lynx_ascend.compress: k and v are on different devices");
    const bool bf16 = IsBf16(k.scalar_type());
    CheckTable(kThr, k.device(), "k_thresholds");
    CheckTable(vThr, k.device(), "v_thresholds");
    CheckTable(kSplit, k.device(), "k_split");
    CheckTable(vSplit, k.device(), "v_split");
    LynxTilingArgs a = Args(k.size(0), k.size(1), k.size(2), pageSize, chunkSize, vChunkSize, anchorBits, vAnchorBits,
                            kAxis, vAxis, numSink, LYNX_MODE_COMPRESS);
    a.center = Center(center);
    a.scalarGrid = ScalarGrid(scalarGrid);
    // the byte grid's sigma levels; nullptr on the float16 grid (the kernel does not read it then)
    at::Tensor sig;
    if (CheckSigmaLevels(sigLevels, a.scalarGrid)) {
        sig = *sigLevels;
        TORCH_CHECK(sig.device() == k.device(), "lynx_ascend: sigma_levels is on ", sig.device(), ", expected ",
                    k.device());
    }
    const LynxTiling t = Tiling(a);
    at::Tensor kc = k.contiguous(), vc = v.contiguous();
    // zeros: the kernel writes the sections; the 32-byte alignment gaps between them stay 0
    at::Tensor anchor = at::zeros({(int64_t)t.anchorTotal}, k.options().dtype(at::kByte));
    at::Tensor residual = at::zeros({(int64_t)t.residualTotal}, k.options().dtype(at::kByte));
    at::Tensor tiling = TilingOn(t, k.device());
    const uint32_t blockDim = BlockDim(t);
    at_npu::native::OpCommand cmd;
    cmd.Name("lynx_compress");
    cmd.SetCustomHandler([=]() -> int {  // captures keep every buffer alive until the launch
        aclrtStream stream = c10_npu::getCurrentNPUStream().stream(false);
        void* s = sig.defined() ? sig.data_ptr() : nullptr;
        if (bf16)
            ACLRT_LAUNCH_KERNEL(lynx_compress_bf16)(blockDim, stream, kc.data_ptr(), vc.data_ptr(), kThr.data_ptr(),
                                                    vThr.data_ptr(), kSplit.data_ptr(), vSplit.data_ptr(), s,
                                                    anchor.data_ptr(), residual.data_ptr(), tiling.data_ptr());
        else
            ACLRT_LAUNCH_KERNEL(lynx_compress_fp16)(blockDim, stream, kc.data_ptr(), vc.data_ptr(), kThr.data_ptr(),
                                                    vThr.data_ptr(), kSplit.data_ptr(), vSplit.data_ptr(), s,
                                                    anchor.data_ptr(), residual.data_ptr(), tiling.data_ptr());
        return 0;
    });
    cmd.Run();
    return {anchor, residual};
}

namespace {

void LaunchDecompress(bool bf16, const LynxTiling& t, const at::Tensor& anchor, const c10::optional<at::Tensor>& residual,
                      const at::Tensor& kMag, const at::Tensor& vMag, const at::Tensor& kOut, const at::Tensor& vOut,
                      const c10::optional<at::Tensor>& slots)
{
    at::Tensor tiling = TilingOn(t, anchor.device());
    at::Tensor res = residual.has_value() ? *residual : at::Tensor();
    at::Tensor slot = slots.has_value() ? *slots : at::Tensor();
    const uint32_t blockDim = BlockDim(t);
    at_npu::native::OpCommand cmd;
    cmd.Name("lynx_decompress");
    cmd.SetCustomHandler([=]() -> int {
        aclrtStream stream = c10_npu::getCurrentNPUStream().stream(false);
        void* r = res.defined() ? res.data_ptr() : nullptr;
        void* s = slot.defined() ? slot.data_ptr() : nullptr;
        if (bf16)
            ACLRT_LAUNCH_KERNEL(lynx_decompress_bf16)(blockDim, stream, anchor.data_ptr(), r, kMag.data_ptr(),
                                                      vMag.data_ptr(), kOut.data_ptr(), vOut.data_ptr(), s,
                                                      tiling.data_ptr());
        else
            ACLRT_LAUNCH_KERNEL(lynx_decompress_fp16)(blockDim, stream, anchor.data_ptr(), r, kMag.data_ptr(),
                                                      vMag.data_ptr(), kOut.data_ptr(), vOut.data_ptr(), s,
                                                      tiling.data_ptr());
        return 0;
    });
    cmd.Run();
}

LynxTiling DecompressTiling(const at::Tensor& anchor, const c10::optional<at::Tensor>& residual, const at::Tensor& kMag,
                            const at::Tensor& vMag, LynxTilingArgs a)
{
    a.useResidual = residual.has_value() ? 1 : 0;
    const LynxTiling t = Tiling(a);
    CheckStream(anchor, t.anchorTotal, anchor.device(), "anchor");
    if (residual.has_value()) CheckStream(*residual, t.residualTotal, anchor.device(), "residual");
    CheckTable(kMag, anchor.device(), "k_magnitudes");
    CheckTable(vMag, anchor.device(), "v_magnitudes");
    return t;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> decompress_npu(const at::Tensor& anchor, const c10::optional<at::Tensor>& residual,
                                                  const at::Tensor& kMag, const at::Tensor& vMag, int64_t h, int64_t t,
                                                  int64_t d, bool bf16, int64_t pageSize, int64_t chunkSize,
                                                  int64_t vChunkSize, int64_t anchorBits, int64_t vAnchorBits,
                                                  int64_t kAxis, int64_t vAxis, int64_t numSink)
{
    const LynxTiling tiling = DecompressTiling(
        anchor, residual, kMag, vMag,
        Args(h, t, d, pageSize, chunkSize, vChunkSize, anchorBits, vAnchorBits, kAxis, vAxis, numSink,
             LYNX_MODE_DECOMPRESS));
    const auto opts = anchor.options().dtype(bf16 ? at::kBFloat16 : at::kHalf);
    at::Tensor kOut = at::empty({h, t, d}, opts), vOut = at::empty({h, t, d}, opts);
    LaunchDecompress(bf16, tiling, anchor, residual, kMag, vMag, kOut, vOut, c10::nullopt);
    return {kOut, vOut};
}

void decompress_paged_npu(const at::Tensor& anchor, const c10::optional<at::Tensor>& residual, const at::Tensor& kMag,
                          const at::Tensor& vMag, at::Tensor& kCache, at::Tensor& vCache, const at::Tensor& slotMapping,
                          int64_t numTokens, int64_t pageSize, int64_t chunkSize, int64_t vChunkSize,
                          int64_t anchorBits, int64_t vAnchorBits, int64_t kAxis, int64_t vAxis, int64_t numSink)
{
    // vLLM-Ascend's caches: separate K and V of [num_blocks, block_size, num_kv_heads, head_size]
    TORCH_CHECK(kCache.dim() == 4 && kCache.sizes() == vCache.sizes() && kCache.is_contiguous() &&
                    vCache.is_contiguous() && kCache.scalar_type() == vCache.scalar_type(),
                "lynx_ascend.decompress_paged: k_cache, v_cache must be contiguous [num_blocks, block_size, "
                "num_kv_heads, head_size] of one shape and dtype");
    TORCH_CHECK(slotMapping.dim() == 1 && slotMapping.numel() >= numTokens && slotMapping.is_contiguous() &&
                    (slotMapping.scalar_type() == at::kInt || slotMapping.scalar_type() == at::kLong),
                "lynx_ascend.decompress_paged: slot_mapping must be contiguous 1-D int32 / int64 with >= num_tokens "
                "entries");
    TORCH_CHECK(slotMapping.device() == anchor.device() && kCache.device() == anchor.device(),
                "lynx_ascend.decompress_paged: all tensors must be on one device");
    const bool bf16 = IsBf16(kCache.scalar_type());
    LynxTilingArgs a = Args(kCache.size(2), numTokens, kCache.size(3), pageSize, chunkSize, vChunkSize, anchorBits,
                            vAnchorBits, kAxis, vAxis, numSink, LYNX_MODE_DECOMPRESS_PAGED);
    a.blockSize = (uint32_t)kCache.size(1);
    a.slotBytes = (uint32_t)slotMapping.element_size();
    a.numSlots = (uint64_t)kCache.size(0) * kCache.size(1);
    const LynxTiling tiling = DecompressTiling(anchor, residual, kMag, vMag, a);
    LaunchDecompress(bf16, tiling, anchor, residual, kMag, vMag, kCache, vCache, slotMapping);
}

}  // namespace lynx_ascend

TORCH_LIBRARY_IMPL(lynx_ascend, PrivateUse1, m)
{
    m.impl("compress", &lynx_ascend::compress_npu);
    m.impl("decompress", &lynx_ascend::decompress_npu);
    m.impl("decompress_paged", &lynx_ascend::decompress_paged_npu);
}
