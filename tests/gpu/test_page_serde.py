"""The page serde on the ``triton`` backend: compress from every CUDA cache layout (the gather
fused into the kernel, scalar previews stored by it) gives the bytes of the codec's
encode_pages, and received pages decoded straight into each layout equal its decode_page.

On a GPU the kernels run compiled on CUDA caches; elsewhere under TRITON_INTERPRET=1 on CPU
tensors with small shapes (CI).
"""
import importlib.util
import os

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (pip install 'lynx_npu[triton]')", allow_module_level=True)
CUDA = torch.cuda.is_available()
if not CUDA and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA device; set TRITON_INTERPRET=1 to run the Triton kernels on the CPU "
                "interpreter (ci/test.sh does)", allow_module_level=True)

from ..ops.serde_checks import (check_decode_into, check_encode_cache,  # noqa: E402
                                check_every_byte_written, check_request)

DEVICE = "cuda" if CUDA else "cpu"
# Every layout vLLM hands a GPU worker (ops/kv_layouts.py), and vLLM-Ascend's K / V tensors.
LAYOUTS = ["vllm_flash_nhd", "vllm_flash_hnd", "vllm_flash_legacy", "vllm_ascend"]
SHAPE = dict(h=2, t=150, d=32) if not CUDA else dict(h=8, t=1100, d=128)
SMALL = {} if not CUDA else {"page_size": 256, "chunk_size": 32}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("order", ["random", "sequential"])
def test_encode_from_cache(layout, order):
    assert check_encode_cache("lynx", layout, order, DEVICE, "triton", **SHAPE, **SMALL) \
        == "triton"


@pytest.mark.parametrize("name", ["lynx-int4", "lynx-int8"])
def test_encode_one_stream_codecs(name):
    check_encode_cache(name, "vllm_flash_nhd", "random", DEVICE, "triton", **SHAPE, **SMALL)


@pytest.mark.parametrize("center", ["midrange", "mean"])
def test_every_byte_written(center):
    check_every_byte_written("lynx", DEVICE, "triton", center=center, **SHAPE, **SMALL)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("stage", ["anchor", "full"])
def test_decode_into_cache(layout, stage):
    assert check_decode_into("lynx", layout, stage, DEVICE, "triton", **SHAPE, **SMALL) \
        == "triton"


def test_decode_one_stream_codec():
    check_decode_into("lynx-int8", "vllm_flash_nhd", "full", DEVICE, "triton", **SHAPE, **SMALL)


@pytest.mark.parametrize("layout", ["vllm_flash_nhd", "vllm_ascend"])
def test_every_layer_of_a_request_in_one_launch(layout):
    assert check_request("lynx", layout, DEVICE, "triton", **SHAPE, **SMALL) == "triton"


@pytest.mark.parametrize("heads_fast", [True, False])
def test_either_grid_order_gives_the_same_bytes(monkeypatch, heads_fast):
    """Compress of a paged request with heads first or pages first in the grid (launch.py
    ``HEADS_FAST``, the paged default chosen by measurement) writes the same bytes."""
    from lynx_npu.gpu import launch
    monkeypatch.setitem(launch.TUNING["compress"], "HEADS_FAST", heads_fast)
    check_request("lynx", "vllm_flash_nhd", DEVICE, "triton", **SHAPE, **SMALL)
