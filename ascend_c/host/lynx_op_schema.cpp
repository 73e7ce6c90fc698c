/*
 * Operator schema of the Lynx kernels (torch.ops.lynx_ascend.*) and their Meta implementations:
 * output shapes from the host tiling, no device work (shape inference, tracing, graph capture).
 * Needs only PyTorch; the NPU implementations are in lynx_torch_ops.cpp (PrivateUse1).
 *
 *   compress(k, v, k_thresholds, v_thresholds, k_split, v_split, sigma_levels?, page_size,
 *            chunk_size, v_chunk_size, anchor_bits, v_anchor_bits, k_axis, v_axis, num_sink_tokens,
 *            center, scalar_grid) -> (anchor, residual)
 *   decompress(anchor, residual?, k_magnitudes, v_magnitudes, num_heads, num_tokens, head_dim, bf16,
 *              page_size, chunk_size, v_chunk_size, anchor_bits, v_anchor_bits, k_axis, v_axis,
 *              num_sink_tokens) -> (k, v)
 *   decompress_paged(anchor, residual?, k_magnitudes, v_magnitudes, k_cache!, v_cache!, slot_mapping,
 *                    num_tokens, page_size, chunk_size, v_chunk_size, anchor_bits, v_anchor_bits,
 *                    k_axis, v_axis, num_sink_tokens) -> ()
 *
 * k, v: [H, T, D] float16 / bfloat16; anchor / residual: uint8 streams in wire format v1 (every
 * page's buffer back to back, payload format 8's end cells); tables: float32 [128] from
 * lynx_npu/codec/lynx_tables.py (ascend_c_host.kernel_tables): thresholds and the end cells'
 * split thresholds (split_thresholds) padded with +inf, magnitudes (the decoded |x| of
 * (m << r) | residual field, 128 entries for every split); chunk_size, v_chunk_size: K's and V's chunk
 * (LynxConfig.chunk("k"), chunk("v")); anchor_bits, v_anchor_bits: K's and V's anchor bits, each
 * in [2, 7], the residual taking the rest of 8 (LynxConfig.bits("k"), bits("v")); axes:
 * 0 = channel, 1 = token; center (LynxConfig.center): 0 = mean, 1 = midrange; scalar_grid
 * (LynxConfig.scalar_grid): 0 = float16, 1 = byte, which takes sigma_levels, the float32 [256]
 * sigma levels of lynx_tables.sigma_levels (None on the float16 grid); decompress reads mu, sigma
 * from the stream, so takes neither; residual None = anchor stage; caches: vLLM-Ascend's [num_blocks,
 * block_size, num_kv_heads, head_size], token t at slot_mapping[t] (negative = skipped).
 */
#include <torch/library.h>

#include "lynx_op_common.h"

namespace lynx_ascend {

// ---- Meta: output shapes from the host tiling, no device work --------------------------------

std::tuple<at::Tensor, at::Tensor> compress_meta(const at::Tensor& k, const at::Tensor& v, const at::Tensor& kThr,
                                                 const at::Tensor& vThr, const at::Tensor& kSplit,
                                                 const at::Tensor& vSplit, const c10::optional<at::Tensor>& sigLevels,
                                                 int64_t pageSize, int64_t chunkSize, int64_t vChunkSize,
                                                 int64_t anchorBits, int64_t vAnchorBits, int64_t kAxis, int64_t vAxis,
                                                 int64_t numSink, int64_t center, int64_t scalarGrid)
{
    TORCH_CHECK(k.dim() == 3 && k.sizes() == v.sizes(), "lynx_ascend.compress: k, v must be [H, T, D] of one shape");
    IsBf16(k.scalar_type());
    LynxTilingArgs a = Args(k.size(0), k.size(1), k.size(2), pageSize, chunkSize, vChunkSize, anchorBits, vAnchorBits,
                            kAxis, vAxis, numSink, LYNX_MODE_COMPRESS);
    a.center = Center(center);
    a.scalarGrid = ScalarGrid(scalarGrid);
    CheckSigmaLevels(sigLevels, a.scalarGrid);
    const LynxTiling t = Tiling(a);
    const auto opts = k.options().dtype(at::kByte);
    return {at::empty({(int64_t)t.anchorTotal}, opts), at::empty({(int64_t)t.residualTotal}, opts)};
}

std::tuple<at::Tensor, at::Tensor> decompress_meta(const at::Tensor& anchor, const c10::optional<at::Tensor>& residual,
                                                   const at::Tensor& kMag, const at::Tensor& vMag, int64_t h, int64_t t,
                                                   int64_t d, bool bf16, int64_t pageSize, int64_t chunkSize,
                                                   int64_t vChunkSize, int64_t anchorBits, int64_t vAnchorBits,
                                                   int64_t kAxis, int64_t vAxis, int64_t numSink)
{
    Tiling(Args(h, t, d, pageSize, chunkSize, vChunkSize, anchorBits, vAnchorBits, kAxis, vAxis, numSink,
                LYNX_MODE_DECOMPRESS));
    const auto opts = anchor.options().dtype(bf16 ? at::kBFloat16 : at::kHalf);
    return {at::empty({h, t, d}, opts), at::empty({h, t, d}, opts)};
}

void decompress_paged_meta(const at::Tensor& anchor, const c10::optional<at::Tensor>& residual, const at::Tensor& kMag,
                           const at::Tensor& vMag, at::Tensor& kCache, at::Tensor& vCache, const at::Tensor& slotMapping,
                           int64_t numTokens, int64_t pageSize, int64_t chunkSize, int64_t vChunkSize,
                           int64_t anchorBits, int64_t vAnchorBits, int64_t kAxis, int64_t vAxis, int64_t numSink)
{
    TORCH_CHECK(kCache.dim() == 4 && kCache.sizes() == vCache.sizes(),
                "lynx_ascend.decompress_paged: k_cache, v_cache must be [num_blocks, block_size, H, D]");
}

}  // namespace lynx_ascend

TORCH_LIBRARY(lynx_ascend, m)
{
    m.def("compress(Tensor k, Tensor v, Tensor k_thresholds, Tensor v_thresholds, Tensor k_split, Tensor v_split, "
          "Tensor? sigma_levels, int page_size, int chunk_size, int v_chunk_size, int anchor_bits, "
          "int v_anchor_bits, int k_axis, int v_axis, int num_sink_tokens, int center, int scalar_grid) "
          "-> (Tensor, Tensor)");
    m.def("decompress(Tensor anchor, Tensor? residual, Tensor k_magnitudes, Tensor v_magnitudes, int num_heads, "
          "int num_tokens, int head_dim, bool bf16, int page_size, int chunk_size, int v_chunk_size, "
          "int anchor_bits, int v_anchor_bits, int k_axis, int v_axis, int num_sink_tokens) -> (Tensor, Tensor)");
    m.def("decompress_paged(Tensor anchor, Tensor? residual, Tensor k_magnitudes, Tensor v_magnitudes, "
          "Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping, int num_tokens, int page_size, "
          "int chunk_size, int v_chunk_size, int anchor_bits, int v_anchor_bits, int k_axis, int v_axis, "
          "int num_sink_tokens) -> ()");
}

TORCH_LIBRARY_IMPL(lynx_ascend, Meta, m)
{
    m.impl("compress", &lynx_ascend::compress_meta);
    m.impl("decompress", &lynx_ascend::decompress_meta);
    m.impl("decompress_paged", &lynx_ascend::decompress_paged_meta);
}
