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

from .kv_layouts import CacheTarget, ResolvedCache, put_tokens, put_whole_blocks


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
        """K or V in tiles (vllm_cpu_amx): backends with ``WRITES_TILES`` write it, the others
        a dense pair that ``scatter_tokens`` writes into the cache."""
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
    if dest.slot_mapping is None:
        slots = torch.arange(token_start, token_start + n, device=dest.device)
    else:
        slots = dest.slot_mapping[token_start:token_start + n].to(torch.int64)
    rows = [x.transpose(0, 1).to(dest.dtype) for x in (k, v)]  # [n, H, D] each
    keep = (slots >= 0) & (slots < dest.num_blocks * dest.block_size)
    if not bool(keep.all()):
        slots, rows = slots[keep], [r[keep] for r in rows]
    bs = dest.block_size
    if dest.tiled:  # whole blocks by block copies; only the rest token by token
        start = _whole_block_starts(slots, bs)
        if start is not None:
            tok = start[:, None] + torch.arange(bs, device=slots.device)
            if put_whole_blocks([(t, r[tok]) for t, r in zip((dest.k, dest.v), rows)],
                                dest.num_blocks, bs, num_kv_heads, head_dim, slots[start] // bs):
                rest = torch.ones_like(slots, dtype=torch.bool)
                rest[tok.reshape(-1)] = False
                slots, rows = slots[rest], [r[rest] for r in rows]
    for tgt, r in zip((dest.k, dest.v), rows):
        put_tokens(tgt, dest.num_blocks, bs, num_kv_heads, head_dim, slots // bs, slots % bs, r)


def _whole_block_starts(slots: torch.Tensor, block_size: int) -> torch.Tensor | None:
    """Indices i where slots[i:i + block_size] fill one block in order (None: no such i)."""
    idx = torch.nonzero(slots % block_size == 0).flatten()
    idx = idx[idx + block_size <= slots.numel()]
    if idx.numel() == 0:
        return None
    ar = torch.arange(block_size, device=slots.device)
    idx = idx[(slots[idx[:, None] + ar] == slots[idx][:, None] + ar).all(1)]
    return idx if idx.numel() else None
