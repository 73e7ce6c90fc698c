"""The NPU path: the CANN-built kernels behind torch_npu, against the reference codec.

Runs only where torch_npu, an NPU and the built operator library (LYNX_ASCEND_OPS_LIB, see
ascend_c/README.md) exist; everywhere else it is skipped with the reason. It has not run here.
"""
import os

import pytest
import torch

from lynx_npu.codec.lynx import LynxCodec

from .parity import random_kv

torch_npu = pytest.importorskip("torch_npu", reason="torch_npu is not installed: no NPU path to test")


@pytest.fixture(scope="module")
def npu_ops():
    if not torch.npu.is_available():
        pytest.skip("torch_npu is installed but no NPU is visible")
    lib = os.environ.get("LYNX_ASCEND_OPS_LIB")
    if not lib or not os.path.exists(lib):
        pytest.skip("LYNX_ASCEND_OPS_LIB does not point at the CANN build of liblynx_ascend_ops.so")
    torch.ops.load_library(lib)
    return torch.ops.lynx_ascend


@pytest.mark.parametrize("split", [(4, 4), (5, 4)])  # K's and V's anchor bits
@pytest.mark.parametrize("grid", ["float16", "byte"])
@pytest.mark.parametrize("center", ["midrange", "mean"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_npu_compress_and_decompress_match_the_reference(npu_ops, dtype, center, grid, split):
    from lynx_npu.ops.ascend_c_host import kernel_tables

    codec = LynxCodec(center=center, scalar_grid=grid, anchor_bits=split[0], v_anchor_bits=split[1])
    cfg = codec.config
    k, v = random_kv(4, 1100, 128, dtype, seed=5)
    ref = codec.encode(k, v)
    axes = {"channel": 0, "token": 1}
    args = (cfg.page_size, cfg.chunk("k"), cfg.chunk("v"), cfg.bits("k"), cfg.bits("v"), axes[cfg.k_axis],
            axes[cfg.v_axis], cfg.num_sink_tokens)
    thr = [kernel_tables(cfg, w, "thresholds").npu() for w in "kv"]
    split_thr = [kernel_tables(cfg, w, "split").npu() for w in "kv"]  # payload format 8's end cells
    mags = [kernel_tables(cfg, w, "magnitudes").npu() for w in "kv"]
    sig = kernel_tables(cfg, "k", "sigma_levels").npu() if grid == "byte" else None
    a, r = npu_ops.compress(k.npu(), v.npu(), *thr, *split_thr, sig, *args, {"mean": 0, "midrange": 1}[center],
                            {"float16": 0, "byte": 1}[grid])
    if center == "midrange":  # no addition order: identical bytes, as in the host-build test
        assert torch.equal(a.cpu(), ref.anchor) and torch.equal(r.cpu(), ref.residual)
    else:
        mismatch = (a.cpu() != ref.anchor).float().mean().item()
        assert mismatch < 1e-3  # same rule as the host-build test: only rounded means may differ
    ko, vo = npu_ops.decompress(ref.anchor.npu(), ref.residual.npu(), *mags, 4, 1100, 128,
                                dtype == torch.bfloat16, *args)
    want_k, want_v = codec.decode(ref, "full")
    assert torch.equal(ko.cpu(), want_k) and torch.equal(vo.cpu(), want_v)
