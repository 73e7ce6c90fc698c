"""Reading and writing a request's tokens in an engine's paged KV cache, for every layer.

The connector moves KV as ``[num_kv_heads, num_tokens, head_dim]`` per layer (the codec's
shape) and the engines keep it in blocks whose layout is backend- and ISA-specific (DESIGN §8):

* ``vllm_cpu``: one tensor per layer ``[num_blocks, num_kv_heads, block_size, 2 * head_size]``
  whose interior is the CPU kernel's own packing (on AVX2/AVX-512 hosts K is column-major, V
  row-major; AMX hosts differ). Nothing is assumed: at start-up the layout is *probed* by
  writing known values with vLLM's own cache kernel and locating them, and writes go through
  that kernel.
* ``vllm_logical``: vLLM >= 0.30 GPU backends hand the connector a logical
  ``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` view (K then V in the last dim)
  whose strides already encode the physical layout, so plain indexing is right.
* ``vllm_ascend``: vLLM-Ascend keeps K and V as two tensors ``[num_blocks, block_size,
  num_kv_heads, head_size]`` (block size 128). Written to its layout, untested here (no NPU).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import vllm_compat

# view(tensor) -> [num_blocks, block_size, num_kv_heads, head_size] strided view
ViewFn = Callable[[torch.Tensor], torch.Tensor]


class KVLayoutError(RuntimeError):
    """The engine's KV cache is not laid out as this adapter expects."""


@dataclass(frozen=True)
class _Affine:
    """Element offset of (block, token, head, dim) = base + dot(index, strides)."""

    base: int
    strides: tuple[int, int, int, int]

    def view(self, cache: torch.Tensor, num_blocks: int, block_size: int, num_heads: int,
             head_size: int) -> torch.Tensor:
        return torch.as_strided(cache, (num_blocks, block_size, num_heads, head_size),
                                self.strides, cache.storage_offset() + self.base)


def probe_cpu_layout(cache: torch.Tensor) -> tuple[_Affine, _Affine]:
    """Locate K and V elements in a vLLM CPU cache by writing through vLLM's kernel.

    Single-element writes give the offsets of the unit steps along (block, token, head, dim);
    a full random write then checks that the affine map holds everywhere and covers every
    element. Raises KVLayoutError if it does not (a packing these views cannot express)."""
    if cache.dim() != 4 or cache.shape[-1] % 2:
        raise KVLayoutError(f"vLLM CPU cache must be [num_blocks, heads, block_size, 2*head_size]"
                            f", got shape {tuple(cache.shape)}")
    _, heads, bs, d2 = cache.shape
    d = d2 // 2
    scratch = torch.zeros((2, heads, bs, d2), dtype=cache.dtype)

    def locate(which: int, block: int, token: int, head: int, dim: int) -> int:
        scratch.zero_()
        kv = [torch.zeros((1, heads, d), dtype=cache.dtype) for _ in range(2)]
        kv[which][0, head, dim] = 1.0
        vllm_compat.cpu_write_kv(kv[0], kv[1], scratch,
                                 torch.tensor([block * bs + token], dtype=torch.int64))
        hits = (scratch.reshape(-1) != 0).nonzero()
        if hits.numel() != 1:
            raise KVLayoutError(f"probe wrote {hits.numel()} elements for one value")
        return int(hits[0])

    maps = []
    for which in (0, 1):
        base = locate(which, 0, 0, 0, 0)
        steps = [locate(which, *unit) - base for unit in
                 ((1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1 % heads, 0), (0, 0, 0, 1))]
        if heads == 1:
            steps[2] = 0
        maps.append(_Affine(base, tuple(steps)))
    if maps[0].strides[0] != heads * bs * d2:
        raise KVLayoutError(f"CPU cache blocks are not contiguous: block stride "
                            f"{maps[0].strides[0]} != {heads * bs * d2}")
    # Every value, every slot: the views must read back exactly what the kernel wrote.
    key = torch.randn((2 * bs, heads, d)).to(cache.dtype)
    value = torch.randn((2 * bs, heads, d)).to(cache.dtype)
    scratch.zero_()
    vllm_compat.cpu_write_kv(key, value, scratch, torch.arange(2 * bs, dtype=torch.int64))
    for m, x in zip(maps, (key, value)):
        got = m.view(scratch, 2, bs, heads, d).reshape(2 * bs, heads, d)
        if not torch.equal(got, x):
            raise KVLayoutError("the probed CPU KV layout does not read back what vLLM wrote")
    covered = torch.zeros(scratch.numel(), dtype=torch.bool)
    for m in maps:
        idx = m.view(torch.arange(scratch.numel()).view(scratch.shape), 2, bs, heads, d)
        covered[idx.reshape(-1)] = True
    if not bool(covered.all()):
        raise KVLayoutError("the probed CPU KV layout leaves cache elements unaccounted for")
    return maps[0], maps[1]


class PagedKV:
    """Token spans of one request, for every layer, in an engine's paged KV cache."""

    def __init__(self, layout: str, caches: list, k_views: list[torch.Tensor],
                 v_views: list[torch.Tensor], block_size: int, num_kv_heads: int,
                 head_size: int, dtype: torch.dtype):
        self.layout, self.caches = layout, caches
        self.k_views, self.v_views = k_views, v_views
        self.block_size, self.num_kv_heads, self.head_size = block_size, num_kv_heads, head_size
        self.dtype = dtype

    @property
    def num_layers(self) -> int:
        return len(self.k_views)

    def slots(self, block_ids, token_start: int, token_end: int) -> torch.Tensor:
        t = torch.arange(token_start, token_end)
        blocks = torch.as_tensor(list(block_ids), dtype=torch.int64)
        if token_end > len(blocks) * self.block_size:
            raise ValueError(f"tokens up to {token_end} need more than the {len(blocks)} "
                             f"blocks of {self.block_size} given")
        return blocks[t // self.block_size] * self.block_size + t % self.block_size

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> k, v [num_kv_heads, len(slots), head_size] (copies)."""
        blk, off = slots // self.block_size, slots % self.block_size
        k = self.k_views[layer][blk, off].permute(1, 0, 2).contiguous()
        v = self.v_views[layer][blk, off].permute(1, 0, 2).contiguous()
        return k, v

    def scatter(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k, v [num_kv_heads, len(slots), head_size] into the slots."""
        if k.shape != (self.num_kv_heads, len(slots), self.head_size) or k.shape != v.shape:
            raise ValueError(f"k/v shapes {tuple(k.shape)}/{tuple(v.shape)} do not match "
                             f"[{self.num_kv_heads}, {len(slots)}, {self.head_size}]")
        k = k.to(self.dtype).permute(1, 0, 2)
        v = v.to(self.dtype).permute(1, 0, 2)
        if self.layout == "vllm_cpu":
            vllm_compat.cpu_write_kv(k.contiguous(), v.contiguous(), self.caches[layer], slots)
            return
        blk, off = slots // self.block_size, slots % self.block_size
        self.k_views[layer][blk, off] = k
        self.v_views[layer][blk, off] = v


def paged_kv_from_vllm(kv_caches: dict, layout: str | None = None) -> PagedKV:
    """Build the adapter for the caches vLLM registered (``register_kv_caches``), layers in
    model order. ``layout`` None picks it from the platform."""
    names = sorted(kv_caches, key=vllm_compat.layer_index)
    caches = [kv_caches[n] for n in names]
    if not caches:
        raise KVLayoutError("no KV cache layers were registered")
    if layout is None:
        if isinstance(caches[0], (tuple, list)):
            layout = "vllm_ascend"
        elif vllm_compat.is_cpu_platform():
            layout = "vllm_cpu"
        else:
            layout = "vllm_logical"
    if layout == "vllm_cpu":
        nb, heads, bs, d2 = caches[0].shape
        k_map, v_map = probe_cpu_layout(caches[0])
        views = [(k_map.view(c, c.shape[0], bs, heads, d2 // 2),
                  v_map.view(c, c.shape[0], bs, heads, d2 // 2)) for c in caches]
        head_size = d2 // 2
    elif layout == "vllm_logical":
        nb, heads, bs, d2 = caches[0].shape
        head_size = d2 // 2
        views = [(c[..., :head_size].transpose(1, 2), c[..., head_size:].transpose(1, 2))
                 for c in caches]
    elif layout == "vllm_ascend":
        nb, bs, heads, head_size = caches[0][0].shape
        views = [(c[0], c[1]) for c in caches]
    else:
        raise KVLayoutError(f"unknown KV cache layout {layout!r}; known: vllm_cpu, "
                            f"vllm_logical, vllm_ascend")
    dtype = views[0][0].dtype
    return PagedKV(layout, caches, [k for k, _ in views], [v for _, v in views], bs, heads,
                   head_size, dtype)
