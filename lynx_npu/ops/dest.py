"""Where decompressed tokens are written: a dense [H, T, D] pair or a paged KV cache.

Both are the same thing to a kernel: token ``t`` goes to slot ``slot_mapping[t]`` (identity
when ``slot_mapping`` is None; negative slots, and slots past the cache, are skipped: vLLM
pads with -1, and a device slot_mapping is not read back to check it), slot ``s`` is
``(block, offset) = divmod(s, block_size)``, and element ``(block, offset, head, dim)`` of K
(V) sits at ``k.offset + block*s_block + offset*s_token + head*s_head + dim*s_dim`` elements
from ``k.tensor.data_ptr()``. A dense output is block_size 1 with s_block = token stride.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .kv_layouts import CacheTarget, ResolvedCache, put_tokens


@dataclass(frozen=True)
class Destination:
    k: CacheTarget
    v: CacheTarget
    block_size: int
    num_blocks: int
    slot_mapping: torch.Tensor | None   # int64 [num_tokens of the plan] on the device
    dtype: torch.dtype

    @property
    def device(self) -> torch.device:
        return self.k.tensor.device

    @property
    def tiled(self) -> bool:
        """K or V in tiles (vllm_cpu_amx): kernels write a dense pair, ``scatter_tokens`` the
        cache."""
        return self.k.tiled or self.v.tiled


def dense(k: torch.Tensor, v: torch.Tensor) -> Destination:
    """k, v: [H, T, D] tensors (any strides) the plan's tokens are written into."""
    def tgt(x):
        sh, st, sd = x.stride()
        return CacheTarget(x, 0, st, 0, sh, sd)
    return Destination(tgt(k), tgt(v), 1, k.shape[1], None, k.dtype)


def paged(cache: ResolvedCache, slot_mapping: torch.Tensor) -> Destination:
    return Destination(cache.k, cache.v, cache.block_size, cache.num_blocks, slot_mapping,
                       cache.dtype)


def scatter_tokens(dest: Destination, token_start: int, k: torch.Tensor, v: torch.Tensor,
                   num_kv_heads: int, head_dim: int) -> None:
    """Write k, v [H, n, D] (plan tokens token_start..+n) to ``dest`` with torch indexing."""
    n = k.shape[1]
    for tgt, x in ((dest.k, k), (dest.v, v)):
        rows = x.transpose(0, 1).to(dest.dtype)  # [n, H, D]
        if dest.slot_mapping is None:
            slots = torch.arange(token_start, token_start + n, device=dest.device)
        else:
            slots = dest.slot_mapping[token_start:token_start + n].to(torch.int64)
        keep = (slots >= 0) & (slots < dest.num_blocks * dest.block_size)
        if not bool(keep.all()):
            slots, rows = slots[keep], rows[keep]
        put_tokens(tgt, dest.num_blocks, dest.block_size, num_kv_heads, head_dim,
                   slots // dest.block_size, slots % dest.block_size, rows)
