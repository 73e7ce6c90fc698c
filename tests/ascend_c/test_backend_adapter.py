"""The lynx_npu.ops backend adapter over the Ascend C kernels, run on the host build.

On an NPU the same adapter drives torch.ops.lynx_ascend (ascend_c_host.npu_backend); here it
drives the g++ build, and is checked against the ``torch`` (reference) backend for layer plans,
page plans (a page buffer on its own), dense outputs and paged caches, both stages, both chunk
centres, both scalar grids; and on an ``npu`` device the default configuration dispatches to it.
"""
import pytest
import torch

from lynx_npu.codec.lynx_config import LynxConfig
from lynx_npu.ops import backends, dest, torch_backend
from lynx_npu.ops.kv_layouts import get_layout, resolve
from lynx_npu.ops.plan import layer_plan, page_plan

from .parity import exact_kv

CFG = LynxConfig(page_size=64, chunk_size=16, num_sink_tokens=3)
H, T, D = 2, 150, 32


@pytest.fixture(scope="module", params=[{"center": "midrange"}, {"center": "mean"},
                                        {"center": "midrange", "v_chunk_size": 64},
                                        {"center": "midrange", "anchor_bits": 5, "v_anchor_bits": 4},
                                        {"center": "midrange", "scalar_grid": "byte"},
                                        {"center": "mean", "scalar_grid": "byte"}], ids=str)
def streams(host_build, request):
    cfg = CFG.replace(**request.param)
    k, v = exact_kv(cfg, H, T, D, torch.bfloat16)
    plan = layer_plan(cfg, H, T, D, torch.bfloat16)
    anchor, residual = host_build.host_backend().compress(k, v, plan)
    want = torch_backend.compress(k, v, plan)
    assert torch.equal(anchor, want[0]) and torch.equal(residual, want[1])
    return plan, anchor, residual


def _dense(plan):
    k = torch.full((plan.num_kv_heads, plan.num_tokens, plan.head_dim), float("nan"), dtype=plan.dtype)
    return k, torch.full_like(k, float("nan"))


@pytest.mark.parametrize("stage", ["anchor", "full"])
def test_layer_into_dense(host_build, streams, stage):
    plan, anchor, residual = streams
    res = residual if stage == "full" else None
    got, want = _dense(plan), _dense(plan)
    host_build.host_backend().decompress(anchor, res, plan, dest.dense(*got))
    torch_backend.decompress(anchor, res, plan, dest.dense(*want))
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("page_index", [0, 1, 2])
def test_one_page_buffer_on_its_own(host_build, streams, page_index):
    plan, anchor, residual = streams
    page = plan.pages[page_index]
    a = anchor[page.anchor_offset:page.anchor_offset + page.layout.anchor_nbytes]
    r = residual[page.residual_offset:page.residual_offset + page.layout.residual_nbytes]
    pplan = page_plan(plan.config, H, D, torch.bfloat16, page.span.token_start, page.span.token_end)
    got, want = _dense(pplan), _dense(pplan)
    host_build.host_backend().decompress(a, r, pplan, dest.dense(*got))
    torch_backend.decompress(a, r, pplan, dest.dense(*want))
    assert all(torch.equal(x, y) for x, y in zip(got, want))


@pytest.mark.parametrize("layout", ["vllm_ascend", "vllm_flash_hnd"])
def test_layer_into_a_paged_cache(host_build, streams, layout):
    """vllm_ascend goes straight through the paged kernel; other layouts through a scatter."""
    plan, anchor, residual = streams
    lay = get_layout(layout)
    slots = torch.randperm(16 * 16, generator=torch.Generator().manual_seed(1))[:T]
    outs = []
    for backend in (host_build.host_backend(), torch_backend):
        caches = lay.allocate(16, 16, H, D, dtype=torch.bfloat16, fill=0.0)
        backend.decompress(anchor, residual, plan, dest.paged(resolve(lay, caches), slots))
        outs.append(caches if isinstance(caches, tuple) else (caches,))
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def test_supports_names_what_it_cannot_run(host_build):
    backend = host_build.host_backend()
    assert backend.supports(LynxConfig(center="mean"), 8, 128, torch.bfloat16) is None
    assert "head_dim=24" in backend.supports(LynxConfig(center="mean"), 8, 24, torch.bfloat16)
    assert "float16 or bfloat16" in backend.supports(LynxConfig(center="mean"), 8, 128, torch.float32)
    assert backend.supports(LynxConfig(v_chunk_size=64), 8, 128, torch.bfloat16) is None  # K, V chunks differ
    assert "v_chunk_size=48" in backend.supports(LynxConfig(v_chunk_size=48), 8, 128, torch.bfloat16)
    for kb, vb in ((5, 4), (4, 5), (6, 3)):  # K, V splits differ
        assert backend.supports(LynxConfig(anchor_bits=kb, v_anchor_bits=vb), 8, 128, torch.bfloat16) is None
    for grid in ("float16", "byte"):  # both scalar grids
        assert backend.supports(LynxConfig(scalar_grid=grid), 8, 128, torch.bfloat16) is None
    for field, value in (("scalar_grid", "int8"), ("center", "median")):
        cfg = LynxConfig()
        object.__setattr__(cfg, field, value)  # past LynxConfig's own check: a value from elsewhere
        reason = backend.supports(cfg, 8, 128, torch.bfloat16)
        assert reason is not None and f"{field}={value!r}" in reason, reason


@pytest.mark.parametrize("cfg", [LynxConfig(), LynxConfig(center="mean"), LynxConfig(anchor_bits=5, v_anchor_bits=4),
                                 LynxConfig(scalar_grid="byte"), LynxConfig(scalar_grid="float16")],
                         ids=["midrange", "mean", "split-5-4", "byte-grid", "float16-grid"])
def test_npu_tensors_dispatch_to_ascend_c(host_build, monkeypatch, cfg):
    """Neither centre, nor scalar grid, nor a K, V split of their own falls back to the torch
    reference on an NPU."""
    monkeypatch.delenv("LYNX_BACKEND", raising=False)
    monkeypatch.setitem(backends._REGISTRY, "ascend_c",  # the host build stands in for the NPU one
                        backends._Entry("ascend_c", ("npu",), host_build.host_backend))
    name, _ = backends.select("npu", None, cfg, 8, 128, torch.bfloat16)
    assert name == "ascend_c"
