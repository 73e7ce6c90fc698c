"""An engine's paged KV cache, every layer, described by one registry layout (kv_layouts.py).

The serde (page_serde.py) reads a request's tokens out of it and writes received pages into
it; the integration builds one from the tensors the engine registered (it only has to name the
layout, probing it first where the engine's packing is ISA-specific). Tokens are addressed by
slots, as vLLM does: token ``t`` of a request lives in slot ``slot_mapping[t]``, which is
``(block, offset) = divmod(slot, block_size)``; slots of negative value are padding.

``read`` / ``write`` move tokens with plain torch indexing (tests, and the fallback where no
kernel reads the layout: a tiled one, vllm_cpu_amx, is read this way); ``row_offsets`` is what
a kernel with a fused gather reads instead.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .kv_layouts import (KVCacheLayout, ResolvedCache, get_layout, put_tokens, resolve,
                         take_tokens, target_view, tile_view)


def slots_for_blocks(block_ids: Sequence[int], block_size: int, token_start: int,
                     token_end: int) -> torch.Tensor:
    """int64 slots of tokens [token_start, token_end) of a request holding ``block_ids``."""
    if not 0 <= token_start <= token_end:
        raise ValueError(f"token range [{token_start=}, {token_end=}) must be ordered and >= 0")
    blocks = torch.as_tensor(list(block_ids), dtype=torch.int64)
    if token_end > len(blocks) * block_size:
        raise ValueError(f"tokens up to {token_end} need more than the {len(blocks)} blocks of "
                         f"{block_size} given")
    t = torch.arange(token_start, token_end)
    return blocks[t // block_size] * block_size + t % block_size


@dataclass(frozen=True)
class PagedKVCache:
    """Every layer of one engine's paged cache: ``layers[i]`` is one tensor or (k, v)."""

    layout: KVCacheLayout
    layers: tuple
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype

    @classmethod
    def build(cls, layout: str | KVCacheLayout, layers: Sequence) -> "PagedKVCache":
        """Check every layer against ``layout`` (shape, strides, dtype) and agree on them."""
        lay = get_layout(layout)
        if not layers:
            raise ValueError("a paged KV cache needs at least one layer")
        first = resolve(lay, layers[0])
        for i, layer in enumerate(layers[1:], 1):
            rc = resolve(lay, layer, first.num_kv_heads, first.head_size)
            if (rc.block_size, rc.dtype, rc.k.tensor.device) != (
                    first.block_size, first.dtype, first.k.tensor.device):
                raise ValueError(f"layer {i} has block size {rc.block_size} / {rc.dtype} on "
                                 f"{rc.k.tensor.device}; layer 0 {first.block_size} / "
                                 f"{first.dtype} on {first.k.tensor.device}")
        return cls(lay, tuple(layers), first.block_size, first.num_kv_heads, first.head_size,
                   first.dtype)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def device(self) -> torch.device:
        first = self.layers[0]
        return (first[0] if self.layout.separate else first).device

    @property
    def tiled(self) -> bool:
        """K or V kept in tiles (vllm_cpu_amx): read by torch indexing (``read_tokens``), written
        by the CPU kernel or by torch indexing (``write``, dest.scatter_tokens)."""
        return is_tiled(self.layer(0))

    def layer(self, i: int) -> ResolvedCache:
        if not 0 <= i < len(self.layers):
            raise ValueError(f"layer {i} is out of range: the cache has {len(self.layers)}")
        return self._resolved[i]

    @functools.cached_property
    def _resolved(self) -> tuple[ResolvedCache, ...]:
        return tuple(resolve(self.layout, x, self.num_kv_heads, self.head_size)
                     for x in self.layers)

    @functools.cached_property
    def layer_offsets(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """Element offsets of every layer's K and V (block 0, token 0, head 0, dim 0) from layer
        0's: one kernel launch can then address every layer (a request's pages of all layers
        in one plan). None where an offset is not a whole number of elements."""
        es = torch.empty((), dtype=self.dtype).element_size()
        out = []
        for which in ("k", "v"):
            t0 = getattr(self._resolved[0], which)
            p0 = t0.tensor.data_ptr() + t0.offset * es
            deltas = []
            for rc in self._resolved:
                t = getattr(rc, which)
                d = t.tensor.data_ptr() + t.offset * es - p0
                if d % es:
                    return None
                deltas.append(d // es)
            out.append(tuple(deltas))
        return out[0], out[1]

    def subset(self, layers: Sequence[int]) -> "PagedKVCache":
        """These layers only (layer j of the result is ``layers[j]``): a batch of layers that
        share a codec config (ops/per_layer_serde.py)."""
        for i in layers:
            self.layer(i)  # range check
        return dataclasses.replace(self, layers=tuple(self.layers[i] for i in layers))

    def slots(self, block_ids: Sequence[int], token_start: int, token_end: int) -> torch.Tensor:
        return slots_for_blocks(block_ids, self.block_size, token_start, token_end)

    def read(self, i: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s tokens at ``slots`` -> dense k, v [num_kv_heads, len(slots), head]."""
        return read_tokens(self.layer(i), slots)

    def write(self, i: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write dense k, v [num_kv_heads, len(slots), head_size] into the slots of layer i."""
        want = (self.num_kv_heads, len(slots), self.head_size)
        if tuple(k.shape) != want or k.shape != v.shape:
            raise ValueError(f"k/v shapes {tuple(k.shape)}/{tuple(v.shape)} do not match {want}")
        rc = self.layer(i)
        slots = slots.to(rc.k.tensor.device, torch.int64)
        blk, off = slots // self.block_size, slots % self.block_size
        for tgt, x in ((rc.k, k), (rc.v, v)):
            put_tokens(tgt, rc.num_blocks, rc.block_size, rc.num_kv_heads, rc.head_size, blk,
                       off, x.to(tgt.tensor.device, rc.dtype).transpose(0, 1))


def is_tiled(rc: ResolvedCache) -> bool:
    return rc.k.tiled or rc.v.tiled


def whole_blocks(slots: torch.Tensor, block_size: int) -> torch.Tensor | None:
    """The blocks of host ``slots`` that fill whole blocks in order (the last one possibly in
    part), as a request's slot mapping does; else None."""
    n = slots.numel()
    if slots.device.type != "cpu" or n == 0:
        return None
    blocks = slots[::block_size] // block_size
    if bool((slots[::block_size] % block_size).any()) or bool((blocks < 0).any()):
        return None
    want = (blocks.repeat_interleave(block_size) * block_size
            + torch.arange(block_size).repeat(blocks.numel()))[:n]
    return blocks if torch.equal(slots, want) else None


def read_tokens(rc: ResolvedCache, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather tokens at ``slots`` of one resolved layer -> dense, contiguous k, v [H, n, D].
    Whole blocks are gathered by block (one strided copy each for K and V)."""
    blocks = whole_blocks(slots, rc.block_size)
    if blocks is not None and is_tiled(rc):  # the blocks' tiles, then one permuting copy
        n, h, d = slots.numel(), rc.num_kv_heads, rc.head_size
        blocks = blocks.to(rc.k.tensor.device)
        return tuple(tile_view(t, rc.num_blocks, rc.block_size, h, d)[blocks]
                     .permute(3, 0, 1, 2, 4, 5).reshape(h, -1, d)[:, :n].contiguous()
                     for t in (rc.k, rc.v))
    if blocks is not None:
        n, g = slots.numel(), _gather_blocks(rc, blocks)
        out = []
        for tgt in (g.k, g.v):
            view = target_view(tgt, g.num_blocks, g.block_size, g.num_kv_heads, g.head_size)
            x = torch.empty(g.num_kv_heads, g.num_blocks, g.block_size, g.head_size,
                            dtype=g.dtype, device=tgt.tensor.device)
            x.copy_(view.permute(2, 0, 1, 3))
            out.append(x.view(g.num_kv_heads, -1, g.head_size)[:, :n])
        return out[0], out[1]
    slots = slots.to(rc.k.tensor.device, torch.int64)
    blk, off = slots // rc.block_size, slots % rc.block_size
    out = []
    for tgt in (rc.k, rc.v):
        rows = take_tokens(tgt, rc.num_blocks, rc.block_size, rc.num_kv_heads, rc.head_size,
                           blk, off)
        out.append(rows.permute(1, 0, 2).contiguous())
    return out[0], out[1]


def _gather_blocks(rc: ResolvedCache, blocks: torch.Tensor) -> ResolvedCache:
    """The layer's ``blocks``, in order, copied whole (their interior as the engine packs it)
    into a cache of the same layout: one memcpy-like index_select on the physical block dim."""
    lay = rc.layout
    logical_b = next(i for i, g in enumerate(lay.shape) if g == ("block",))
    inverse = sorted(range(len(lay.order)), key=lambda i: lay.order[i])
    tensors = (rc.k.tensor, rc.v.tensor) if lay.separate else (rc.k.tensor,)
    blocks = blocks.to(tensors[0].device)
    out = [t.permute(*lay.order).index_select(lay.order.index(logical_b), blocks)
           .permute(*inverse) for t in tensors]
    return resolve(lay, tuple(out) if lay.separate else out[0])


def row_align(rc: ResolvedCache, *offsets: int) -> int:
    """A number (elements) dividing every token row offset of ``rc`` (row_offsets) and the
    given offsets: kernels that read offsets from memory keep their accesses vectorized."""
    return math.gcd(rc.k.s_block, rc.k.s_token, rc.v.s_block, rc.v.s_token, *offsets)


def row_offsets(rc: ResolvedCache, slots: torch.Tensor) -> torch.Tensor:
    """int64 [n] element offsets of each token's (head 0, dim 0) from the cache's block 0,
    the same for K and V: what a compress kernel with a fused gather reads per token."""
    if (rc.k.s_block, rc.k.s_token) != (rc.v.s_block, rc.v.s_token) or is_tiled(rc):
        raise ValueError(f"{rc.layout.name}: K and V token strides differ or are tiled; "
                         f"gather first (read_tokens)")
    slots = slots.to(rc.k.tensor.device, torch.int64)
    return (slots // rc.block_size) * rc.k.s_block + (slots % rc.block_size) * rc.k.s_token


def dense_run(rc: ResolvedCache, slots: torch.Tensor):
    """(k, v) strided [H, n, D] views when host ``slots`` are consecutive and blocks are
    evenly spaced (a contiguous run of blocks: no gather needed), else None."""
    n = slots.numel()
    if slots.device.type != "cpu" or n == 0 or is_tiled(rc):
        return None
    s0 = int(slots[0])
    if s0 < 0 or not torch.equal(slots, torch.arange(s0, s0 + n, dtype=slots.dtype)):
        return None
    if s0 % rc.block_size or (s0 + n) > rc.num_blocks * rc.block_size:
        return None
    out = []
    for tgt in (rc.k, rc.v):
        if tgt.s_block != rc.block_size * tgt.s_token:
            return None
        base = tgt.tensor.storage_offset() + tgt.offset + (s0 // rc.block_size) * tgt.s_block
        out.append(torch.as_strided(tgt.tensor, (rc.num_kv_heads, n, rc.head_size),
                                    (tgt.s_head, tgt.s_token, tgt.s_dim), base))
    return out[0], out[1]
