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

from ..ops.serde_checks import (block_slots, check_decode_into,  # noqa: E402
                                check_encode_cache, check_encode_slots,
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


def test_a_kernel_without_tiles_decodes_into_a_tiled_cache_through_a_dense_pair():
    """vllm_cpu_amx (a CPU layout; here for the serde's path around a kernel that addresses no
    tiles: decoded into a dense pair, then the tokens the pages cover scattered)."""
    if CUDA:
        pytest.skip("vllm_cpu_amx is a CPU cache layout")
    for stage in ("anchor", "full"):
        assert check_decode_into("lynx", "vllm_cpu_amx", stage, DEVICE, "triton", **SHAPE,
                                 **SMALL) == "triton"


def test_decode_one_stream_codec():
    check_decode_into("lynx-int8", "vllm_flash_nhd", "full", DEVICE, "triton", **SHAPE, **SMALL)


@pytest.mark.parametrize("layout", ["vllm_flash_nhd", "vllm_ascend"])
def test_every_layer_of_a_request_in_one_launch(layout):
    assert check_request("lynx", layout, DEVICE, "triton", **SHAPE, **SMALL) == "triton"


@pytest.mark.parametrize("plan", [((1, 5, 4),), ((0, 6, 6), (2, 3, 5))], ids=["K-only", "two"])
def test_every_layer_of_a_request_with_a_split_per_layer(plan):
    """Each layer config's layers one launch (ops/per_layer_serde.py), each layer its own
    bytes and values."""
    assert check_request("lynx", "vllm_flash_nhd", DEVICE, "triton", num_layers=4,
                         layer_anchor_bits=plan, **SHAPE, **SMALL) == "triton"


# K and V with chunks of their own: V chunks of 64 along head_dim (the planned default; one
# chunk per token-head at head_dim 64, two at 128), and V on the channel axis with chunks
# twice K's.
K_CHUNK = SMALL.get("chunk_size", 16)  # serde_checks.small_codec's on the interpreter
PER_TENSOR_CHUNKS = {"v64-d64": dict(v_chunk_size=64, d=64),
                     "v64-d128": dict(v_chunk_size=64, d=128),
                     "v-channel": dict(v_axis="channel", v_chunk_size=2 * K_CHUNK)}


@pytest.mark.parametrize("chunks", list(PER_TENSOR_CHUNKS.values()),
                         ids=list(PER_TENSOR_CHUNKS))
def test_per_tensor_chunks_encode_and_decode_into_cache(chunks):
    kw = {**SHAPE, **SMALL, **chunks}
    assert check_encode_cache("lynx", "vllm_flash_nhd", "random", DEVICE, "triton", **kw) \
        == "triton"
    for stage in ("anchor", "full"):
        assert check_decode_into("lynx", "vllm_flash_nhd", stage, DEVICE, "triton", **kw) \
            == "triton"


@pytest.mark.parametrize("heads_fast", [True, False])
def test_either_grid_order_gives_the_same_bytes(monkeypatch, heads_fast):
    """Compress of a paged request with heads first or pages first in the grid (launch.py
    ``HEADS_FAST``, the paged default chosen by measurement) writes the same bytes."""
    from lynx_npu.gpu import launch
    monkeypatch.setitem(launch.TUNING["compress"], "HEADS_FAST", heads_fast)
    check_request("lynx", "vllm_flash_nhd", DEVICE, "triton", **SHAPE, **SMALL)


# The GPU's pages (256 tokens, chunks of 32) and head_dim: K's compress threads walk 8
# consecutive tokens of a page, V's steps read 16 (lynx_compress.py ``_run_rows``,
# ``_win_rows``), so a cache block's consecutive rows are read from a few offsets; page 0's
# 4 sinks put every page's first token 4 tokens into a block, and t = 300 leaves a last page
# of 40 tokens (read per token).
RUNS = dict(h=2, d=128, page_size=256, chunk_size=32)


def _run_slots(kind: str, t: int = 300, bs: int = 16):
    nb = -(-t // bs) + 3
    if kind == "blocks":  # whole blocks in random order
        return block_slots(t, nb, bs, "random", seed=3), bs
    if kind == "entered":  # the first block entered 5 tokens in (every run's phase moves)
        blocks = torch.randperm(nb, generator=torch.Generator().manual_seed(4))
        tt = torch.arange(t) + 5
        return blocks[tt // bs] * bs + tt % bs, bs
    if kind == "tokens":  # single tokens anywhere: every page read per token
        return torch.randperm(nb * bs, generator=torch.Generator().manual_seed(5))[:t], bs
    if kind == "swapped":  # whole blocks, but two tokens of page 1 swapped: only it per token
        s = block_slots(t, nb, bs, "random", seed=6).clone()
        s[[270, 281]] = s[[281, 270]]
        return s, bs
    if kind in ("block8", "block32"):  # other block sizes: runs of 8 / 32 rows
        b = int(kind[5:])
        return block_slots(t, -(-t // b) + 3, b, "random", seed=7), b
    raise ValueError(kind)


@pytest.fixture
def runs(monkeypatch):
    """The paged compress with runs of rows on (launch.py ``PAGED_RUNS``, the default),
    whatever the default."""
    from lynx_npu.gpu import launch
    monkeypatch.setitem(launch.TUNING["compress"], "ROW_BLOCKS", True)


@pytest.mark.parametrize("kind", ["blocks", "swapped"])
def test_paged_compress_per_token_when_runs_are_off(monkeypatch, kind):
    """``ROW_BLOCKS`` False: one launch reads every row per token (MODE 0), the same bytes."""
    from lynx_npu.gpu import launch
    monkeypatch.setitem(launch.TUNING["compress"], "ROW_BLOCKS", False)
    slots, bs = _run_slots(kind)
    assert check_encode_slots("lynx", "vllm_flash_nhd", slots, DEVICE, "triton", block_size=bs,
                              **RUNS) == "triton"


@pytest.mark.parametrize("kind", ["blocks", "entered", "tokens", "swapped", "block8", "block32"])
def test_paged_compress_any_slot_mapping(runs, kind):
    """The paged compress reads a page's rows as runs of a block's consecutive rows where the
    page's offsets are such runs (one launch), and per token where they are not (a second;
    decided per page): the bytes equal the reference for every slot mapping."""
    slots, bs = _run_slots(kind)
    assert check_encode_slots("lynx", "vllm_flash_nhd", slots, DEVICE, "triton", block_size=bs,
                              **RUNS) == "triton"


@pytest.mark.parametrize("v_chunk", [32, 64])
def test_paged_compress_reads_runs_for_the_gpu_pages(runs, v_chunk):
    """Both K's and V's launches of those pages read runs (a block size the kernel tries)."""
    from lynx_npu.codec.lynx_config import make_config
    from lynx_npu.gpu import launch
    cfg = make_config(page_size=256, chunk_size=32, v_chunk_size=v_chunk)
    view = torch.empty(2, 16, 128)
    for which in "kv":
        assert launch._row_block(view, launch._blocks(cfg, 128, which), which) == 16


@pytest.mark.parametrize("kind", ["blocks", "tokens"])
def test_paged_compress_v_chunks_of_64(runs, kind):
    """V chunks of 64 along head_dim (two per token-head): runs of rows, and per token."""
    slots, bs = _run_slots(kind)
    assert check_encode_slots("lynx", "vllm_flash_nhd", slots, DEVICE, "triton", block_size=bs,
                              **RUNS, v_chunk_size=64) == "triton"


def test_every_layer_of_a_request_in_runs(runs):
    """Layers of 300 tokens in one launch: layer l's rows start at token l * 300 of the plan,
    so each layer's blocks start at another phase of the launch's token index."""
    check_request("lynx", "vllm_flash_nhd", DEVICE, "triton", t=300, **RUNS)


WINDOW = dict(h=1, t=2100, d=16) if not CUDA else dict(h=8, t=2100, d=128)


def test_every_layer_of_a_request_with_its_window():
    """2100 tokens: each layer's last page carries a recent-token window, and its residual
    frame leaves the window's rows out (payload format 9), both filled on the host from what
    the kernels wrote; the anchor-only layers decode through the window."""
    assert check_request("lynx", "vllm_flash_nhd", DEVICE, "triton", num_layers=2,
                         **WINDOW) == "triton"
