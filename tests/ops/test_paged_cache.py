"""PagedKVCache: one registry layout for every layer; tokens read and written by slot; the
in-place view of a contiguous run of blocks addresses the same elements as the gather."""
import pytest
import torch

from lynx_npu.ops import KV_CACHE_LAYOUTS
from lynx_npu.ops.paged_cache import (PagedKVCache, dense_run, read_tokens, row_offsets,
                                      slots_for_blocks)
from lynx_npu.ops.kv_layouts import target_view

H, D, BS = 2, 16, 16  # D 16: vllm_cpu_amx keeps V in tiles of 16 channels


@pytest.mark.parametrize("layout", sorted(KV_CACHE_LAYOUTS))
def test_write_read_round_trip_and_row_offsets(layout):
    lay = KV_CACHE_LAYOUTS[layout]
    cache = PagedKVCache.build(layout, [lay.allocate(6, BS, H, D, fill=0.0) for _ in range(2)])
    assert (cache.num_layers, cache.block_size, cache.num_kv_heads, cache.head_size) == (
        2, BS, H, D)
    slots = cache.slots([4, 1, 5], 0, 40)  # ragged: the last block partly used
    k, v = torch.randn(H, 40, D).to(torch.bfloat16), torch.randn(H, 40, D).to(torch.bfloat16)
    cache.write(1, slots, k, v)
    rk, rv = cache.read(1, slots)
    assert torch.equal(rk, k) and torch.equal(rv, v)
    assert not cache.read(0, slots)[0].any()  # the other layer untouched
    rc = cache.layer(1)
    if (rc.k.s_block, rc.k.s_token) == (rc.v.s_block, rc.v.s_token):
        rows = row_offsets(rc, slots)
        for tgt, want in ((rc.k, k), (rc.v, v)):
            flat = tgt.tensor.as_strided((tgt.tensor.numel(),), (1,), tgt.tensor.storage_offset())
            got = torch.stack([flat[tgt.offset + r + torch.arange(H)[:, None] * tgt.s_head
                                    + torch.arange(D)[None, :] * tgt.s_dim] for r in rows], 1)
            assert torch.equal(got, want)


@pytest.mark.parametrize("layout", sorted(KV_CACHE_LAYOUTS))
def test_dense_run_is_the_gather_where_it_exists(layout):
    lay = KV_CACHE_LAYOUTS[layout]
    cache = PagedKVCache.build(layout, [lay.allocate(6, BS, H, D)])
    tensors = cache.layers[0]
    for t in tensors if lay.separate else (tensors,):
        t.copy_(torch.randn(t.shape))
    rc = cache.layer(0)
    slots = torch.arange(2 * BS, 2 * BS + 37)
    run = dense_run(rc, slots)
    if layout in ("vllm_flash_nhd", "vllm_flash_legacy", "vllm_ascend"):
        assert run is not None
        gk, gv = read_tokens(rc, slots)
        assert torch.equal(run[0], gk) and torch.equal(run[1], gv)
    else:  # token stride differs across blocks: no single view
        assert run is None
    assert dense_run(rc, slots.flip(0)) is None
    assert dense_run(rc, torch.arange(3, 40)) is None  # not on a block boundary


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="blocks"):
        slots_for_blocks([0], BS, 0, BS + 1)
    with pytest.raises(ValueError, match="at least one layer"):
        PagedKVCache.build("vllm_cpu", [])
    lay = KV_CACHE_LAYOUTS["vllm_flash_nhd"]
    with pytest.raises(ValueError, match="kv heads"):
        PagedKVCache.build("vllm_flash_nhd", [lay.allocate(2, BS, H, D),
                                              lay.allocate(2, BS, H + 1, D)])
    cache = PagedKVCache.build("vllm_flash_nhd", [lay.allocate(2, BS, H, D)])
    with pytest.raises(ValueError, match="out of range"):
        cache.layer(1)
    with pytest.raises(ValueError, match="do not match"):
        cache.write(0, torch.arange(3), torch.zeros(H, 2, D), torch.zeros(H, 2, D))
    assert target_view(cache.layer(0).k, 2, BS, H, D).shape == (2, BS, H, D)
