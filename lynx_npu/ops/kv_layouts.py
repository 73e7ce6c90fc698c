"""Paged KV-cache layouts of the engines Lynx writes into, described once, as data.

Every layout is dense in memory, so each K or V element ``(block, token-in-block, head, dim)``
lives at an affine element offset from its tensor's data pointer. A layout states

* ``shape``: the tensor's logical dims, each a group of axes (``("kv", "dim")`` is a dim of
  size ``2 * head_size``), which is how the engine allocates it;
* ``order``: the physical (memory) order of those logical dims, outermost first (the engine's
  stride order; identity for a contiguous tensor);
* ``k_axes`` / ``v_axes``: the physical order of the element axes of K and V inside that dense
  memory. They differ only where an engine stores K and V regions differently (vLLM CPU).
* ``k_tiles`` / ``v_tiles``: axes split into tiles, ``(("token", 16), ("dim", 2))``: the token
  axis is then two axes in ``k_axes``, ``token_hi`` (which tile) and ``token_lo`` (the token
  in it), and likewise ``dim``: vLLM's AMX layout packs K as [block_size / 16][head_size / 2]
  tiles of 16 tokens x 2 channels. The CPU kernel writes tiled targets itself (its Dest
  carries the tiles); the other kernels address untiled ones only (``target_view``), and
  tiled ones are otherwise read and written by torch indexing (``take_tokens`` /
  ``put_tokens`` / ``put_whole_blocks``).

From these, :func:`resolve` computes the strides every backend uses; no backend branches on
the layout's name. Sources: vLLM 0.32 ``v1/attention/backends/cpu_attn.py`` and
``csrc/cpu/cpu_attn_vec.hpp`` ("reshape K as column-major and V as row-major"), the AMX
layout as vLLM 0.23 / 0.32's ``cpu_attn_reshape_and_cache`` writes it on an AMX host (probed
element by element, integration/vllm_ascend/kv_cache_io.py),
``v1/kv_cache_layout.py`` (LBNHC / LBHNC stride orders), pre-0.30 vLLM FlashAttention
(``[2, num_blocks, block_size, num_kv_heads, head_size]``), vLLM-Ascend (separate K and V
``[num_blocks, block_size, num_kv_heads, head_size]``, ``npu_scatter_pa_kv_cache``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

AXES = ("block", "token", "head", "dim", "kv")


@dataclass(frozen=True)
class KVCacheLayout:
    name: str
    description: str
    separate: bool                          # True: K and V are two tensors of this shape
    shape: tuple[tuple[str, ...], ...]      # logical dims as groups of axes
    order: tuple[int, ...]                  # physical order of the logical dims
    k_axes: tuple[str, ...]                 # physical order of a K element's axes
    v_axes: tuple[str, ...]
    k_tiles: tuple[tuple[str, int], ...] = ()   # (axis, tile size): axis_hi / axis_lo axes
    v_tiles: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        flat = [a for g in self.shape for a in g]
        need = {"block", "token", "head", "dim"} | (set() if self.separate else {"kv"})
        if sorted(flat) != sorted(need):
            raise ValueError(f"layout {self.name}: shape {self.shape} must name each of {need}")
        for axes, tiles in ((self.k_axes, self.k_tiles), (self.v_axes, self.v_tiles)):
            split = {a for a, q in tiles if a in ("token", "dim") and q > 1 and not q & (q - 1)}
            if len(split) != len(tiles):
                raise ValueError(f"layout {self.name}: tiles {tiles} must split token or dim, "
                                 f"each once, into tiles of a power of two above one")
            want = (need - split) | {f"{a}_{p}" for a in split for p in ("hi", "lo")}
            if sorted(axes) != sorted(want):
                raise ValueError(f"layout {self.name}: axes {axes} must be a permutation of "
                                 f"{sorted(want)}")
        if sorted(self.order) != list(range(len(self.shape))):
            raise ValueError(f"layout {self.name}: order {self.order} must permute the dims")

    def allocate(self, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                 dtype=torch.bfloat16, device="cpu", fill: float | None = None):
        """A cache as the engine would allocate it (tensor, or (k, v) when separate)."""
        sizes = {"block": num_blocks, "token": block_size, "head": num_kv_heads,
                 "dim": head_size, "kv": 2}
        dims = [math.prod(sizes[a] for a in g) for g in self.shape]
        phys = torch.empty([dims[i] for i in self.order], dtype=dtype, device=device)
        if fill is not None:
            phys.fill_(fill)
        inverse = sorted(range(len(self.order)), key=lambda i: self.order[i])
        t = phys.permute(*inverse)
        if self.separate:
            other = torch.empty_like(phys)
            if fill is not None:
                other.fill_(fill)
            return t, other.permute(*inverse)
        return t


def _layout(name, description, separate, shape, order, k_axes, v_axes=None, k_tiles=(),
            v_tiles=()):
    return KVCacheLayout(name, description, separate, tuple(tuple(g) for g in shape),
                         tuple(order), tuple(k_axes), tuple(v_axes or k_axes), tuple(k_tiles),
                         tuple(v_tiles))


_B, _H, _N, _KVD = ("block",), ("head",), ("token",), ("kv", "dim")
KV_CACHE_LAYOUTS: dict[str, KVCacheLayout] = {l.name: l for l in (
    _layout("vllm_cpu",
            "vLLM CPU attention (ISA 'vec'/'vec16': x86 AVX2/AVX-512 without AMX, vLLM 0.32): one "
            "tensor [num_blocks, num_kv_heads, block_size, 2*head_size]; per (block, head) the K "
            "region [head_size][block_size] (column-major), then the V region "
            "[block_size][head_size]. AMX hosts keep bfloat16 in blocks of a multiple of 32 as "
            "vllm_cpu_amx.",
            False, (_B, _H, _N, _KVD), (0, 1, 2, 3),
            ("block", "head", "kv", "dim", "token"), ("block", "head", "kv", "token", "dim")),
    _layout("vllm_cpu_amx",
            "vLLM CPU attention, ISA 'amx' (bfloat16 KV in blocks of a multiple of 32 on a CPU "
            "with AMX tiles; vLLM 0.23 and 0.32): one tensor [num_blocks, num_kv_heads, "
            "block_size, 2*head_size]; per (block, head) the K region as tiles "
            "[block_size/16][head_size/2][16 tokens][2 channels], then the V region as "
            "[head_size/16][block_size/2][16 channels][2 tokens].",
            False, (_B, _H, _N, _KVD), (0, 1, 2, 3),
            ("block", "head", "kv", "token_hi", "dim_hi", "token_lo", "dim_lo"),
            ("block", "head", "kv", "dim_hi", "token_hi", "dim_lo", "token_lo"),
            k_tiles=(("token", 16), ("dim", 2)), v_tiles=(("token", 2), ("dim", 16))),
    _layout("vllm_flash_nhd",
            "vLLM 0.32 GPU attention, KVCacheLayout LBNHC (NHD): logical [num_blocks, "
            "num_kv_heads, block_size, 2*head_size], physical [num_blocks, block_size, "
            "num_kv_heads, 2*head_size]; K = [..., :head_size], V = [..., head_size:].",
            False, (_B, _H, _N, _KVD), (0, 2, 1, 3), ("block", "token", "head", "kv", "dim")),
    _layout("vllm_flash_hnd",
            "vLLM 0.32 GPU attention, KVCacheLayout LBHNC (HND): [num_blocks, num_kv_heads, "
            "block_size, 2*head_size], contiguous.",
            False, (_B, _H, _N, _KVD), (0, 1, 2, 3), ("block", "head", "token", "kv", "dim")),
    _layout("vllm_flash_legacy",
            "vLLM FlashAttention before the stride-order layouts (and vLLM-Ascend's pinned "
            "vLLM on GPU): [2, num_blocks, block_size, num_kv_heads, head_size].",
            False, (("kv",), _B, _N, _H, ("dim",)), (0, 1, 2, 3, 4),
            ("kv", "block", "token", "head", "dim")),
    _layout("vllm_ascend",
            "vLLM-Ascend: separate K and V tensors [num_blocks, block_size, num_kv_heads, "
            "head_size] (block size 128), as npu_scatter_pa_kv_cache writes them.",
            True, (_B, _N, _H, ("dim",)), (0, 1, 2, 3), ("block", "token", "head", "dim")),
)}


@dataclass(frozen=True)
class CacheTarget:
    """Where one of K / V goes: tensor plus element strides of (block, token, head, dim). A
    tiled target splits token and / or dim: token ``o`` of a block is at ``(o // token_tile) *
    s_token_hi + (o % token_tile) * s_token`` (dim likewise); untiled, the tiles are 1."""

    tensor: torch.Tensor
    offset: int          # element offset of (0, 0, 0, 0) from tensor.data_ptr()
    s_block: int
    s_token: int
    s_head: int
    s_dim: int
    token_tile: int = 1
    s_token_hi: int = 0
    dim_tile: int = 1
    s_dim_hi: int = 0

    @property
    def tiled(self) -> bool:
        return self.token_tile > 1 or self.dim_tile > 1


@dataclass(frozen=True)
class ResolvedCache:
    layout: KVCacheLayout
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    k: CacheTarget
    v: CacheTarget


def get_layout(layout: str | KVCacheLayout) -> KVCacheLayout:
    if isinstance(layout, KVCacheLayout):
        return layout
    if layout not in KV_CACHE_LAYOUTS:
        raise ValueError(f"unknown KV cache layout {layout!r}; layouts: {', '.join(KV_CACHE_LAYOUTS)}")
    return KV_CACHE_LAYOUTS[layout]


def _dense_strides(axes, sizes) -> dict[str, int]:
    out, s = {}, 1
    for a in reversed(axes):
        out[a] = s
        s *= sizes[a]
    return out


def resolve(layout: str | KVCacheLayout, kv_caches, num_kv_heads: int | None = None,
            head_size: int | None = None) -> ResolvedCache:
    """Check ``kv_caches`` against ``layout`` and compute the K and V element strides."""
    lay = get_layout(layout)
    tensors = tuple(kv_caches) if lay.separate else (kv_caches,)
    if lay.separate and len(tensors) != 2:
        raise ValueError(f"layout {lay.name} takes (k_cache, v_cache); got {len(tensors)} tensors")
    if not lay.separate and not isinstance(kv_caches, torch.Tensor):
        raise ValueError(f"layout {lay.name} takes one cache tensor; got {type(kv_caches).__name__}")
    t0 = tensors[0]
    if t0.dim() != len(lay.shape):
        raise ValueError(f"{lay.name} cache must have rank {len(lay.shape)} "
                         f"({lay.description}); got shape {tuple(t0.shape)}")
    sizes: dict[str, int] = {"kv": 2}
    for g, n in zip(lay.shape, t0.shape):
        if len(g) == 1:
            sizes[g[0]] = n
    for g, n in zip(lay.shape, t0.shape):
        if len(g) == 2:  # ("kv", "dim")
            if n % 2:
                raise ValueError(f"{lay.name} cache dim of size {n} must be 2 * head_size")
            sizes["dim"] = n // 2
    if num_kv_heads is not None and sizes["head"] != num_kv_heads:
        raise ValueError(f"{lay.name} cache has {sizes['head']} kv heads, the stream {num_kv_heads}")
    if head_size is not None and sizes["dim"] != head_size:
        raise ValueError(f"{lay.name} cache has head_size {sizes['dim']}, the stream {head_size}")
    dims = [math.prod(sizes[a] for a in g) for g in lay.shape]
    phys_strides = _dense_strides(list(range(len(dims))), dict(enumerate(dims[i] for i in lay.order)))
    want = [0] * len(dims)
    for pos, i in enumerate(lay.order):
        want[i] = phys_strides[pos]
    for name, t in zip(("k_cache", "v_cache") if lay.separate else ("kv_cache",), tensors):
        if list(t.shape) != dims:
            raise ValueError(f"{name} shape {tuple(t.shape)} differs from {dims} ({lay.name})")
        if list(t.stride()) != want:
            raise ValueError(f"{name} strides {t.stride()} are not the dense {lay.name} layout "
                             f"{tuple(want)} ({lay.description})")
        if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"{name} dtype {t.dtype} must be float16, bfloat16 or float32")
    if lay.separate and (tensors[1].dtype != t0.dtype or tensors[1].device != t0.device):
        raise ValueError("k_cache and v_cache must share dtype and device")

    def target(t, axes, tiles, kv_index, which):
        sub = dict(sizes)
        for axis, q in tiles:
            if sizes[axis] % q:
                raise ValueError(f"{lay.name} keeps {which} in tiles of {q} along {axis}; "
                                 f"the cache's {axis} size {sizes[axis]} is not a multiple")
            sub[f"{axis}_hi"], sub[f"{axis}_lo"] = sizes[axis] // q, q
        st = _dense_strides(axes, sub)
        q = dict(tiles)
        lo = {a: st[f"{a}_lo"] if a in q else st[a] for a in ("token", "dim")}
        return CacheTarget(t, kv_index * st.get("kv", 0), st["block"], lo["token"], st["head"],
                           lo["dim"], q.get("token", 1), st.get("token_hi", 0),
                           q.get("dim", 1), st.get("dim_hi", 0))

    k = target(tensors[0], lay.k_axes, lay.k_tiles, 0, "K")
    v = target(tensors[-1], lay.v_axes, lay.v_tiles, 0 if lay.separate else 1, "V")
    return ResolvedCache(lay, sizes["block"], sizes["token"], sizes["head"], sizes["dim"],
                         t0.dtype, k, v)


def target_view(t: CacheTarget, num_blocks: int, block_size: int, num_kv_heads: int,
                head_size: int) -> torch.Tensor:
    """The target as a strided view [num_blocks, block_size, num_kv_heads, head_size]
    (untiled targets: what the kernels address)."""
    if t.tiled:
        raise ValueError("a tiled cache target has no [blocks, tokens, heads, dim] view; "
                         "read and write it with take_tokens / put_tokens")
    return torch.as_strided(t.tensor, (num_blocks, block_size, num_kv_heads, head_size),
                            (t.s_block, t.s_token, t.s_head, t.s_dim),
                            t.tensor.storage_offset() + t.offset)


def tile_view(t: CacheTarget, num_blocks: int, block_size: int, num_kv_heads: int,
               head_size: int) -> torch.Tensor:
    """[num_blocks, block_size / qt, qt, num_kv_heads, head_size / qd, qd] (qt, qd: the
    tiles; 1 where untiled)."""
    qt, qd = t.token_tile, t.dim_tile
    hi_t = t.s_token_hi if qt > 1 else t.s_token
    hi_d = t.s_dim_hi if qd > 1 else t.s_dim
    return torch.as_strided(
        t.tensor, (num_blocks, block_size // qt, qt, num_kv_heads, head_size // qd, qd),
        (t.s_block, hi_t, t.s_token, t.s_head, hi_d, t.s_dim),
        t.tensor.storage_offset() + t.offset)


def take_tokens(t: CacheTarget, num_blocks: int, block_size: int, num_kv_heads: int,
                head_size: int, blocks: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Tokens at (blocks[i], offsets[i]) of the target -> [n, num_kv_heads, head_size]."""
    view = tile_view(t, num_blocks, block_size, num_kv_heads, head_size)
    q = t.token_tile
    return view[blocks, offsets // q, offsets % q].reshape(-1, num_kv_heads, head_size)


def put_tokens(t: CacheTarget, num_blocks: int, block_size: int, num_kv_heads: int,
               head_size: int, blocks: torch.Tensor, offsets: torch.Tensor,
               rows: torch.Tensor) -> None:
    """Write rows [n, num_kv_heads, head_size] to tokens (blocks[i], offsets[i])."""
    view = tile_view(t, num_blocks, block_size, num_kv_heads, head_size)
    q = t.token_tile
    view[blocks, offsets // q, offsets % q] = rows.reshape(
        rows.shape[0], num_kv_heads, head_size // t.dim_tile, t.dim_tile)


def put_whole_blocks(pairs, num_blocks: int, block_size: int, num_kv_heads: int,
                     head_size: int, blocks: torch.Tensor) -> bool:
    """Write whole blocks: ``pairs`` of (target, rows [m, block_size, heads, head_size]) into
    ``blocks`` [m] (each target's tensor gathered once, its tiles written by one strided copy,
    scattered back by block): several times faster than ``put_tokens`` on a tiled target.
    False, having written nothing, where a tensor has no block dim of stride ``s_block``."""
    plans = []
    for tgt in {id(t.tensor): t for t, _ in pairs}.values():
        tensor = tgt.tensor
        dims = [i for i in range(tensor.dim()) if tensor.stride(i) == tgt.s_block
                and tensor.shape[i] == num_blocks]
        if not dims:
            return False
        scratch = tensor.index_select(dims[0], blocks)
        if scratch.stride() != tensor.stride():
            return False
        plans.append((tensor, dims[0], scratch))
    m = blocks.numel()
    for tensor, dim, scratch in plans:
        for t, rows in pairs:
            if t.tensor is tensor:
                qt, qd = t.token_tile, t.dim_tile
                local = CacheTarget(scratch, t.offset, t.s_block, t.s_token, t.s_head, t.s_dim,
                                    qt, t.s_token_hi, qd, t.s_dim_hi)
                tile_view(local, m, block_size, num_kv_heads, head_size).copy_(
                    rows.reshape(m, block_size // qt, qt, num_kv_heads, head_size // qd, qd))
        tensor.index_copy_(dim, blocks, scratch)
    return True


def every_token(t: CacheTarget, num_blocks: int, block_size: int, num_kv_heads: int,
                head_size: int) -> torch.Tensor:
    """Every slot of the target, in slot order -> [num_blocks * block_size, heads, head_size]
    (a copy)."""
    slots = torch.arange(num_blocks * block_size, device=t.tensor.device)
    return take_tokens(t, num_blocks, block_size, num_kv_heads, head_size,
                       slots // block_size, slots % block_size)
