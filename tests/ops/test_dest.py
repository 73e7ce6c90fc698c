"""scatter_tokens: a tiled cache (vllm_cpu_amx) written by whole blocks where the slots fill
blocks, token by token elsewhere, equals the token-by-token write and touches nothing else."""
import torch

from lynx_npu.ops import KV_CACHE_LAYOUTS, PagedKVCache
from lynx_npu.ops.dest import paged, scatter_tokens

H, D, BS = 2, 32, 32


def test_whole_blocks_and_the_rest_equal_the_token_by_token_write():
    lay = KV_CACHE_LAYOUTS["vllm_cpu_amx"]
    ours = PagedKVCache.build(lay, [lay.allocate(9, BS, H, D, torch.bfloat16, fill=-7.0)])
    want = PagedKVCache.build(lay, [lay.allocate(9, BS, H, D, torch.bfloat16, fill=-7.0)])
    t = 4 * BS + 11  # blocks 6, 2, 7 and 0 whole; 3 in part
    slots = ours.slots([6, 2, 7, 0, 3], 0, t).clone()
    slots[BS + 5] = -1  # block 2 no longer whole: written token by token, less that slot
    k, v = (torch.randn(H, t, D).to(torch.bfloat16) for _ in "kv")
    scatter_tokens(paged(ours.layer(0), slots), 0, k, v, H, D)
    keep = slots >= 0
    want.write(0, slots[keep], k[:, keep], v[:, keep])
    assert torch.equal(ours.layers[0], want.layers[0])
    assert int((ours.layers[0] != -7.0).sum()) == 2 * H * D * int(keep.sum())
