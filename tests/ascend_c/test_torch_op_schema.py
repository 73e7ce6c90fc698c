"""torch.ops.lynx_ascend: the operator schema and Meta implementations, built against the
installed PyTorch (the NPU implementations need torch_npu + CANN and are not built here)."""
import pytest
import torch

from lynx_npu.codec.lynx import LynxCodec

from .parity import random_kv


def _codec_args(cfg):
    axes = {"channel": 0, "token": 1}
    return (cfg.page_size, cfg.chunk("k"), cfg.chunk("v"), cfg.bits("k"), cfg.bits("v"), axes[cfg.k_axis],
            axes[cfg.v_axis], cfg.num_sink_tokens)


def _compress_args(cfg):
    return (*_codec_args(cfg), {"mean": 0, "midrange": 1}[cfg.center], {"float16": 0, "byte": 1}[cfg.scalar_grid])


# V's own chunk; K's and V's own splits (code sections of different sizes)
@pytest.mark.parametrize("overrides", [{}, {"v_chunk_size": 64}, {"anchor_bits": 5, "v_anchor_bits": 4},
                                       {"anchor_bits": 6, "v_anchor_bits": 3, "v_chunk_size": 64}], ids=str)
@pytest.mark.parametrize("grid", ["float16", "byte"])
@pytest.mark.parametrize("center", ["midrange", "mean"])
@pytest.mark.parametrize("shape", [(2, 300, 64), (4, 3, 128), (1, 1000, 16)])
def test_meta_shapes_match_the_reference_streams(host_build, shape, center, grid, overrides):
    host_build.load_op_schema()
    codec = LynxCodec(center=center, scalar_grid=grid, **overrides)
    k, v = random_kv(*shape, torch.bfloat16)
    enc = codec.encode(k, v)
    meta = dict(device="meta")
    thr = torch.empty(128, **meta)
    sig = torch.empty(256, **meta) if grid == "byte" else None
    a, r = torch.ops.lynx_ascend.compress(k.to(**meta), v.to(**meta), thr, thr, thr, thr, sig,
                                          *_compress_args(codec.config))
    assert (a.dtype, a.shape, r.shape) == (torch.uint8, enc.anchor.shape, enc.residual.shape)
    ko, vo = torch.ops.lynx_ascend.decompress(a, r, thr, thr, *shape, True, *_codec_args(codec.config))
    assert ko.shape == vo.shape == shape and ko.dtype == torch.bfloat16
    cache = torch.empty(8, 128, shape[0], shape[2], dtype=torch.bfloat16, **meta)
    torch.ops.lynx_ascend.decompress_paged(a, None, thr, thr, cache, cache.clone(),
                                           torch.empty(shape[1], dtype=torch.int64, **meta), shape[1],
                                           *_codec_args(codec.config))


def test_compress_takes_the_split_thresholds_sigma_levels_and_the_scalar_grid(host_build):
    host_build.load_op_schema()
    names = [a.name for a in torch.ops.lynx_ascend.compress.default._schema.arguments]
    assert names[:7] == ["k", "v", "k_thresholds", "v_thresholds", "k_split", "v_split", "sigma_levels"]
    assert names[-2:] == ["center", "scalar_grid"]


@pytest.mark.parametrize("op", ["decompress", "decompress_paged"])
def test_decompress_takes_the_magnitude_tables(host_build, op):
    """Payload format 8: the decoder reads magnitudes[(m << r) | field], not levels[...]."""
    host_build.load_op_schema()
    names = [a.name for a in getattr(torch.ops.lynx_ascend, op).default._schema.arguments]
    assert names[2:4] == ["k_magnitudes", "v_magnitudes"]


@pytest.mark.parametrize("op", ["compress", "decompress", "decompress_paged"])
def test_every_op_takes_v_anchor_bits_after_anchor_bits(host_build, op):
    host_build.load_op_schema()
    names = [a.name for a in getattr(torch.ops.lynx_ascend, op).default._schema.arguments]
    i = names.index("chunk_size")
    assert names[i:i + 7] == ["chunk_size", "v_chunk_size", "anchor_bits", "v_anchor_bits", "k_axis", "v_axis",
                              "num_sink_tokens"]


def test_schema_rejects_unsupported_requests_and_has_no_cpu_kernel(host_build):
    host_build.load_op_schema()
    args = _compress_args(LynxCodec(scalar_grid="float16").config)
    x = torch.empty(2, 10, 24, dtype=torch.float16, device="meta")
    thr = torch.empty(128, device="meta")
    with pytest.raises(RuntimeError, match="head_dim=24"):
        torch.ops.lynx_ascend.compress(x, x, thr, thr, thr, thr, None, *args)
    y = torch.empty(2, 10, 32, dtype=torch.float16, device="meta")
    with pytest.raises(RuntimeError, match="center=2"):
        torch.ops.lynx_ascend.compress(y, y, thr, thr, thr, thr, None, *args[:-2], 2, 0)
    with pytest.raises(RuntimeError, match=r"scalar_grid=2 must be 0 \(float16\) or 1 \(byte\)"):
        torch.ops.lynx_ascend.compress(y, y, thr, thr, thr, thr, None, *args[:-1], 2)
    byte = _compress_args(LynxCodec(scalar_grid="byte").config)
    with pytest.raises(RuntimeError, match="needs the sigma_levels table"):
        torch.ops.lynx_ascend.compress(y, y, thr, thr, thr, thr, None, *byte)
    with pytest.raises(RuntimeError, match=r"sigma_levels must be a contiguous float32 \[256\] table"):
        torch.ops.lynx_ascend.compress(y, y, thr, thr, thr, thr, thr, *byte)
    z = torch.empty(2, 10, 64, dtype=torch.float16, device="meta")
    with pytest.raises(RuntimeError, match="head_dim=64 must be a multiple of v_chunk_size=48"):
        torch.ops.lynx_ascend.compress(z, z, thr, thr, thr, thr, None,
                                       *_compress_args(LynxCodec(v_chunk_size=48, scalar_grid="float16").config))
    bad = list(args)
    bad[4] = 8  # v_anchor_bits (LynxConfig refuses it itself)
    with pytest.raises(RuntimeError, match="v_anchor_bits=8 must be in"):
        torch.ops.lynx_ascend.compress(y, y, thr, thr, thr, thr, None, *bad)
    k, v = random_kv(2, 10, 32, torch.float16)
    with pytest.raises(NotImplementedError):
        torch.ops.lynx_ascend.compress(k, v, *[torch.zeros(128)] * 4, None, *args)
