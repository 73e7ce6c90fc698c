"""KV-cache layouts: the strides from the layout table address what each engine reads."""
import pytest
import torch

from lynx_npu.ops import KV_CACHE_LAYOUTS
from lynx_npu.ops.kv_layouts import resolve, target_view

B, N, H, D = 3, 16, 2, 8


def engine_views(name, cache):
    """(K, V) as [num_blocks, block_size, heads, head_size], read the way each engine reads."""
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
    cache = lay.allocate(B, N, H, D, dtype=torch.float32, fill=0.0)
    rc = resolve(lay, cache)
    assert (rc.num_blocks, rc.block_size, rc.num_kv_heads, rc.head_size) == (B, N, H, D)
    want_k = torch.arange(B * N * H * D, dtype=torch.float32).view(B, N, H, D)
    target_view(rc.k, B, N, H, D).copy_(want_k)
    target_view(rc.v, B, N, H, D).copy_(-want_k - 1)
    k, v = engine_views(name, cache)
    assert torch.equal(k, want_k) and torch.equal(v, -want_k - 1)


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
