"""The multi-core split and the double-buffered pipeline do not change a byte.

Each work item (page, K|V, head) is computed by one core from its own inputs, so any block count,
and blocks run in any order, give the same streams; and BUFFER_NUM = 2 (ping-pong queues) gives
the same bytes as BUFFER_NUM = 1. The host build also checks, on every launch, that the kernel
allocated exactly the Unified Buffer the tiling planned and that every queue hand-over was legal.
"""
import pytest
import torch

from lynx_npu.codec.lynx import LynxCodec

from .parity import random_kv

SHAPE = (2, 600, 128)  # with 256-token pages: several row blocks per page


@pytest.fixture(scope="module", params=[("midrange", "float16"), ("mean", "float16"), ("midrange", "byte"),
                                        ("mean", "byte")], ids="-".join)
def layer(request):
    center, grid = request.param
    codec = LynxCodec(center=center, scalar_grid=grid)
    k, v = random_kv(*SHAPE, torch.bfloat16, seed=4)
    return codec.config, k, v


@pytest.mark.parametrize("block_dim", [1, 2, 7, 40, 1000])
def test_block_count_and_order_do_not_change_bytes(host_build, layer, block_dim):
    cfg, k, v = layer
    base = host_build.compress(k, v, cfg, block_dim=1)
    for reverse in (False, True):
        a, r = host_build.compress(k, v, cfg, block_dim=block_dim, reverse_blocks=reverse)
        assert torch.equal(a, base[0]) and torch.equal(r, base[1])
        kk, vv = host_build.decompress(a, r, SHAPE, torch.bfloat16, cfg, block_dim=block_dim,
                                       reverse_blocks=reverse)
        k1, v1 = host_build.decompress(a, r, SHAPE, torch.bfloat16, cfg, block_dim=1)
        assert torch.equal(kk, k1) and torch.equal(vv, v1)


def test_double_buffering_gives_the_same_bytes_as_single(host_build, layer):
    cfg, k, v = layer
    assert host_build.library(2).lynx_host_buffer_num() == 2
    assert host_build.library(1).lynx_host_buffer_num() == 1
    a2, r2 = host_build.compress(k, v, cfg, buffer_num=2)
    a1, r1 = host_build.compress(k, v, cfg, buffer_num=1)
    assert torch.equal(a1, a2) and torch.equal(r1, r2)
    for stage in ("anchor", "full"):
        out2 = host_build.decompress(a2, r2, SHAPE, torch.bfloat16, cfg, stage=stage, buffer_num=2)
        out1 = host_build.decompress(a2, r2, SHAPE, torch.bfloat16, cfg, stage=stage, buffer_num=1)
        assert all(torch.equal(x, y) for x, y in zip(out1, out2))


def test_several_row_blocks_per_page_are_pipelined(host_build, layer):
    cfg, k, v = layer
    tiling = host_build.make_tiling(cfg, *SHAPE, torch.bfloat16)
    assert tiling.rows_per_block < cfg.page_size   # each page streams through the queues in pieces
    assert tiling.ub_bytes <= 192 * 1024           # Atlas A2 AI Vector core Unified Buffer
