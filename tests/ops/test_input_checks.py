"""Issue 18, item 8 (ops): the op set refuses what the reference codec refuses, on every
backend path this machine runs, and decodes every finite input finite.

- NaN / Inf (one +Inf used to turn 256 outputs NaN; a NaN decoded to 2.0156) and, for
  bfloat16 / float32, a page channel range past float32: ValueError naming the tensor, from
  the torch backend (the reference) and from the CPU kernel under each ISA build (the kernel
  flags them in its first pass), through ops.compress and through the page serde;
- float16 at +-65504 decompresses finite on every backend (the kernel saturates as the
  reference does, so they stay byte-identical);
- decompress(None, ...) names the argument instead of raising AttributeError.
"""
import pytest
import torch

import lynx_npu
from lynx_npu import ops
from lynx_npu.ops import cpu_backend, list_backends
from lynx_npu.ops.page_serde import serde_for

from .serde_checks import block_slots, make_cache

CFG = lynx_npu.get_codec("lynx", page_size=64, chunk_size=16).config.replace(
    scalar_preview=False)
HAVE_CPU = list_backends()["cpu"] is None
ISAS = [n for n in ("native", "avx2", "scalar") if HAVE_CPU and cpu_backend.isa_unavailable(n)
        is None]


def each_backend(monkeypatch):
    """(label, backend) for the torch reference and every CPU kernel build this CPU runs."""
    yield "torch", "torch"
    for isa in ISAS:
        monkeypatch.setenv(cpu_backend.ISA_ENV, isa)
        yield f"cpu/{isa}", "cpu"


def _kv(dtype, h=2, t=150, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(h, t, d, generator=g).to(dtype),
            torch.randn(h, t, d, generator=g).to(dtype))


# (where, why): a body token of page 1, a sink token (copied exact, checked apart), the last
# value of a ragged page
SPOTS = [(1, 70, 5), (0, 2, 31), (1, 149, 31)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_compress_refuses_non_finite_input_on_every_backend(monkeypatch, dtype, bad):
    k, v = _kv(dtype)
    for which in "kv":
        for spot in SPOTS:
            kk, vv = k.clone(), v.clone()
            (kk if which == "k" else vv)[spot] = bad
            for label, backend in each_backend(monkeypatch):
                with pytest.raises(ValueError, match=rf"{which} contains NaN or Inf \(first at "
                                                     rf"index \({spot[0]}, {spot[1]}, "
                                                     rf"{spot[2]}\)"):
                    ops.compress(kk, vv, CFG, backend=backend)
    for label, backend in each_backend(monkeypatch):  # finite input still compresses
        ops.compress(k, v, CFG, backend=backend)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_compress_refuses_a_page_range_past_float32(monkeypatch, dtype):
    k, v = _kv(dtype)
    v[1, 80, 3], v[1, 90, 3] = 3e38, -3e38   # one channel of page 1 spans 6e38
    for label, backend in each_backend(monkeypatch):
        with pytest.raises(ValueError, match=r"v spans .*overflows float32"):
            ops.compress(k, v, CFG, backend=backend)
    v[1, 90, 3] = -1e38                       # 4e38 - still past float32's 3.4e38
    for label, backend in each_backend(monkeypatch):
        with pytest.raises(ValueError, match="overflows float32"):
            ops.compress(k, v, CFG, backend=backend)


@pytest.mark.skipif(not HAVE_CPU, reason="cpu backend unavailable")
def test_the_page_serde_refuses_non_finite_cache_tokens(monkeypatch):
    codec = lynx_npu.get_codec("lynx", page_size=64, chunk_size=16)
    k, v = _kv(torch.bfloat16)
    cache, nb = make_cache("vllm_cpu", 2, 150, 32, torch.bfloat16, "cpu")
    slots = block_slots(150, nb, cache.block_size, "random")
    layer = cache.layer(0)
    from lynx_npu.ops.dest import paged, scatter_tokens
    v[0, 100, 7] = float("nan")
    scatter_tokens(paged(layer, slots), 0, k, v, 2, 32)
    for isa in ISAS:
        monkeypatch.setenv(cpu_backend.ISA_ENV, isa)
        with pytest.raises(ValueError, match="contains NaN or Inf"):
            serde_for(codec, "cpu").encode_cache(layer, slots)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_every_finite_input_decompresses_finite_on_every_backend(monkeypatch, dtype):
    """The largest values each dtype holds that a page can carry: float16's 65504, and
    2**126 for bfloat16 / float32 (a page channel's range must stay finite in float32)."""
    top = 65504.0 if dtype == torch.float16 else 2.0 ** 126
    g = torch.Generator().manual_seed(1)
    k = ((torch.rand(2, 150, 32, generator=g) * 2 - 1) * top).to(dtype)
    k[:, 10], k[:, 11] = top, -top
    v = k.flip(1).contiguous()
    ref = ops.compress(k, v, CFG, backend="torch")
    want = {stage: ops.decompress(ref[0], None if stage == "anchor" else ref[1], CFG, k.shape,
                                  dtype, backend="torch") for stage in ("anchor", "full")}
    for stage, (wk, wv) in want.items():
        assert bool(torch.isfinite(wk).all() and torch.isfinite(wv).all()), stage
    for label, backend in each_backend(monkeypatch):
        a, r = ops.compress(k, v, CFG, backend=backend)
        assert torch.equal(a, ref[0]) and torch.equal(r, ref[1]), label
        for stage, (wk, wv) in want.items():
            gk, gv = ops.decompress(a, None if stage == "anchor" else r, CFG, k.shape, dtype,
                                    backend=backend)
            assert torch.equal(gk, wk) and torch.equal(gv, wv), (label, stage)


def test_decompress_names_a_missing_buffer():
    shape = (2, 150, 32)
    anchor, residual = ops.compress(*_kv(torch.float16), CFG, backend="torch")
    with pytest.raises(ValueError, match="anchor must be a 1-D uint8 tensor, got NoneType"):
        ops.decompress(None, None, CFG, shape, torch.float16)
    with pytest.raises(ValueError, match="residual must be a 1-D uint8 tensor or None, got "
                                         "bytes"):
        ops.decompress(anchor, b"\x00", CFG, shape, torch.float16)
    with pytest.raises(ValueError, match="anchor must be a 1-D uint8 tensor, got NoneType"):
        ops.decompress_page(None, None, CFG, 0, 64, num_kv_heads=2, head_dim=32,
                            dtype=torch.float16)
    with pytest.raises(ValueError, match="shape must be"):
        ops.decompress(anchor, residual, CFG, None, torch.float16)
