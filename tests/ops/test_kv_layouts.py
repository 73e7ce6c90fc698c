"""KV-cache layouts: the strides from the layout table address what each engine reads."""
import pytest
import torch

from lynx_npu.ops import KV_CACHE_LAYOUTS
from lynx_npu.ops.kv_layouts import (KVCacheLayout, put_tokens, resolve, take_tokens,
                                     target_view)

B, N, H, D = 3, 16, 2, 8
DIMS = {"vllm_cpu_amx": (B, 32, H, 32)}  # its tiles: 16 tokens (K), 16 channels (V)


def engine_views(name, cache, B=B, N=N, H=H, D=D):
    """(K, V) as [num_blocks, block_size, heads, head_size], read the way each engine reads."""
    if name == "vllm_cpu_amx":  # per (block, head): K [N/16][D/2][16][2], V [D/16][N/2][16][2]
        kc, vc = cache.view(B, H, 2, N * D).unbind(2)
        k = kc.reshape(B, H, N // 16, D // 2, 16, 2).permute(0, 2, 4, 1, 3, 5).reshape(B, N, H, D)
        v = vc.reshape(B, H, D // 16, N // 2, 16, 2).permute(0, 3, 5, 1, 2, 4).reshape(B, N, H, D)
        return k, v
    if name == "vllm_cpu":  # cpu_attn.py: view [B, H, 2N, D], chunk(2, dim=2); K column-major
        kc, vc = cache.view(B, H, 2 * N, D).chunk(2, dim=2)
        k = torch.stack([torch.stack([kc[b, h].reshape(-1).view(D, N).t() for h in range(H)], 1)
                         for b in range(B)])
        return k, vc.transpose(1, 2)
    if name in ("vllm_flash_nhd", "vllm_flash_hnd"):  # flash_attn.py: transpose(1, 2).split(D, -1)
        return cache.transpose(1, 2).split(D, dim=-1)
    if name == "vllm_flash_legacy":
        return cache[0], cache[1]
    return cache


@pytest.mark.parametrize("name", sorted(KV_CACHE_LAYOUTS))
def test_strides_address_what_the_engine_reads(name):
    lay = KV_CACHE_LAYOUTS[name]
    b, n, h, d = DIMS.get(name, (B, N, H, D))
    cache = lay.allocate(b, n, h, d, dtype=torch.float32, fill=0.0)
    rc = resolve(lay, cache)
    assert (rc.num_blocks, rc.block_size, rc.num_kv_heads, rc.head_size) == (b, n, h, d)
    want_k = torch.arange(b * n * h * d, dtype=torch.float32).view(b, n, h, d)
    blocks = torch.arange(b).repeat_interleave(n)
    offsets = torch.arange(n).repeat(b)
    for tgt, x in ((rc.k, want_k), (rc.v, -want_k - 1)):
        put_tokens(tgt, b, n, h, d, blocks, offsets, x.reshape(b * n, h, d))
        assert torch.equal(take_tokens(tgt, b, n, h, d, blocks, offsets), x.reshape(b * n, h, d))
        if not tgt.tiled:
            assert torch.equal(target_view(tgt, b, n, h, d), x)
    k, v = engine_views(name, cache, b, n, h, d)
    assert torch.equal(k, want_k) and torch.equal(v, -want_k - 1)


def test_tiled_layouts_refuse_what_their_tiles_cannot_hold():
    """vllm_cpu_amx: blocks of a multiple of 16 tokens (K) and heads of a multiple of 16
    channels (V); kernels' views of a tiled target are refused, not wrong."""
    lay = KV_CACHE_LAYOUTS["vllm_cpu_amx"]
    with pytest.raises(ValueError, match="V in tiles of 16 along dim; the cache's dim size 8"):
        resolve(lay, lay.allocate(2, 32, 2, 8))
    with pytest.raises(ValueError, match="K in tiles of 16 along token; the cache's token size 8"):
        resolve(lay, lay.allocate(2, 8, 2, 32))
    rc = resolve(lay, lay.allocate(2, 32, 2, 32))
    with pytest.raises(ValueError, match="tiled cache target"):
        target_view(rc.k, 2, 32, 2, 32)
    with pytest.raises(ValueError, match="tiles of a power of two above one"):
        KVCacheLayout("x", "", False, lay.shape, lay.order, lay.k_axes, lay.v_axes,
                      (("token", 12), ("dim", 2)), lay.v_tiles)


def test_flash_nhd_is_a_permuted_tensor():
    cache = KV_CACHE_LAYOUTS["vllm_flash_nhd"].allocate(B, N, H, D)
    assert tuple(cache.shape) == (B, H, N, 2 * D) and not cache.is_contiguous()


def test_wrong_caches_are_rejected():
    with pytest.raises(ValueError, match="rank"):
        resolve("vllm_cpu", torch.zeros(B, H, N))
    with pytest.raises(ValueError, match="strides"):
        resolve("vllm_cpu", torch.zeros(B, H, 2 * D, N).transpose(2, 3))
    with pytest.raises(ValueError, match="2 \\* head_size"):
        resolve("vllm_cpu", torch.zeros(B, H, N, 7))
    with pytest.raises(ValueError, match=r"\(k_cache, v_cache\)"):
        resolve("vllm_ascend", (torch.zeros(B, N, H, D),))
    with pytest.raises(ValueError, match="kv heads"):
        resolve("vllm_ascend", KV_CACHE_LAYOUTS["vllm_ascend"].allocate(B, N, H, D), num_kv_heads=3)
