"""The engine's paged KV cache as a lynx_npu.ops.PagedKVCache: which registry layout it is.

Layouts are described once, in lynx_npu/ops/kv_layouts.py; this module only decides which one
the tensors vLLM registered are (DESIGN §8):

* vLLM CPU: one tensor per layer ``[num_blocks, num_kv_heads, block_size, 2 * head_size]``
  whose interior is the CPU attention kernel's own packing (ISA-specific: on AVX2 / AVX-512
  hosts K is column-major, V row-major; on AMX hosts bfloat16 in blocks of a multiple of 32 is
  tiled for the AMX unit, ``vllm_cpu_amx``). Nothing is assumed: at start-up
  random KV is written with vLLM's own cache op into a scratch cache and read back through each
  candidate registry layout; the one that reads back exactly, every element accounted for, is
  the layout, and the serde then writes it directly. No match: KVLayoutError.
* vLLM >= 0.30 GPU backends hand the connector a logical ``[num_blocks, num_kv_heads,
  block_size, 2 * head_size]`` view whose strides are the physical layout (NHD or HND): the
  registry layout whose strides match.
* vLLM-Ascend 0.23: each layer a ``(k_cache, v_cache)`` pair of ``[num_blocks, block_size,
  num_kv_heads, head_size]`` tensors (model_runner_v1.py ``_reshape_kv_cache_tensors``; block
  size 128): ``vllm_ascend``, checked at start-up the CPU way, with vLLM-Ascend's own cache
  write (vllm_compat.ascend_write_kv: ``torch_npu._npu_reshape_and_cache`` on the NPU). MLA and
  sparse-attention layers (K and V of other widths, or extra indexer caches in the tuple) are
  refused by name. Tested here on CPU tensors of that shape, with the op's contract; the NPU
  op itself has not run here (no NPU).
"""
from __future__ import annotations

import torch

from lynx_npu.ops import KV_CACHE_LAYOUTS, PagedKVCache
from lynx_npu.ops.kv_layouts import every_token, resolve, target_view

from . import vllm_compat

# Registry layouts of one [num_blocks, num_kv_heads, block_size, 2 * head_size] tensor.
CPU_CANDIDATES = ("vllm_cpu", "vllm_cpu_amx", "vllm_flash_hnd")
GPU_CANDIDATES = ("vllm_flash_nhd", "vllm_flash_hnd")


class KVLayoutError(RuntimeError):
    """The engine's KV cache is not laid out as any registry layout describes."""


def probe_cpu_layout(cache: torch.Tensor) -> str:
    """The registry layout vLLM's CPU cache op writes for caches like ``cache``: random KV is
    written into a scratch cache of two blocks and must read back exactly, and every element
    must belong to one K or V value."""
    if cache.dim() != 4 or cache.shape[-1] % 2:
        raise KVLayoutError(f"vLLM CPU cache must be [num_blocks, heads, block_size, 2*head_size]"
                            f", got shape {tuple(cache.shape)}")
    _, heads, bs, d2 = cache.shape
    d = d2 // 2
    key = torch.randn((2 * bs, heads, d)).to(cache.dtype)
    value = torch.randn((2 * bs, heads, d)).to(cache.dtype)
    scratch = torch.zeros((2, heads, bs, d2), dtype=cache.dtype)
    vllm_compat.cpu_write_kv(key, value, scratch, torch.arange(2 * bs, dtype=torch.int64))
    tried = []
    for name in CPU_CANDIDATES:
        try:
            rc = resolve(name, scratch)
        except ValueError as e:  # a tiled layout whose tiles this cache's sizes cannot hold
            tried.append(f"{name} ({e})")
            continue
        views = [every_token(t, 2, bs, heads, d) for t in (rc.k, rc.v)]
        if not (torch.equal(views[0], key) and torch.equal(views[1], value)):
            tried.append(name)
            continue
        covered = torch.zeros(scratch.numel(), dtype=torch.bool)
        # element numbers as float32 (exact below 2**24; resolve takes KV dtypes only)
        index = resolve(name, torch.arange(scratch.numel(), dtype=torch.float32)
                        .view(scratch.shape))
        for t in (index.k, index.v):
            covered[every_token(t, 2, bs, heads, d).reshape(-1).long()] = True
        if bool(covered.all()):
            return name
        tried.append(f"{name} (leaves elements unaccounted for)")
    isa = vllm_compat.cpu_attn_isa(cache.dtype, bs, d)
    raise KVLayoutError(f"vLLM's CPU cache op (ISA {isa!r}) writes a layout no registry layout "
                        f"describes (tried {', '.join(tried)}); add it to "
                        f"lynx_npu/ops/kv_layouts.py")


def probe_ascend_layout(k_cache: torch.Tensor, v_cache: torch.Tensor) -> str:
    """``vllm_ascend`` if vLLM-Ascend's cache write into scratch caches like these reads back
    exactly through that registry layout (random values, as many as the scratch caches hold:
    every element is accounted for); else KVLayoutError."""
    shape = tuple(k_cache.shape)
    if k_cache.dim() != 4 or tuple(v_cache.shape) != shape or v_cache.dtype != k_cache.dtype:
        raise KVLayoutError(f"vLLM-Ascend K and V caches must both be [num_blocks, block_size, "
                            f"num_kv_heads, head_size] of one dtype, got K {shape} "
                            f"{k_cache.dtype} and V {tuple(v_cache.shape)} {v_cache.dtype} "
                            f"(MLA caches are not supported)")
    _, bs, heads, d = shape
    dev = k_cache.device
    key, value = (torch.randn((2 * bs, heads, d)).to(dev, k_cache.dtype) for _ in range(2))
    scratch = [torch.zeros((2, bs, heads, d), dtype=k_cache.dtype, device=dev) for _ in "kv"]
    vllm_compat.ascend_write_kv(key, value, *scratch, torch.arange(2 * bs, device=dev))
    rc = resolve("vllm_ascend", tuple(scratch))
    views = [target_view(t, 2, bs, heads, d).reshape(2 * bs, heads, d) for t in (rc.k, rc.v)]
    if not (torch.equal(views[0], key) and torch.equal(views[1], value)):
        raise KVLayoutError("vLLM-Ascend's cache write does not read back through the "
                            "vllm_ascend registry layout; fix lynx_npu/ops/kv_layouts.py")
    return "vllm_ascend"


def _ascend_pairs(caches: list) -> list[tuple[torch.Tensor, torch.Tensor]]:
    pairs = []
    for c in caches:
        if len(c) != 2:
            raise KVLayoutError(f"a vLLM-Ascend layer registered {len(c)} cache tensors; Lynx "
                                f"supports (k_cache, v_cache) pairs (no sparse-attention "
                                f"indexer caches)")
        pairs.append(tuple(c))
    return pairs


def _by_strides(cache: torch.Tensor, candidates) -> str:
    errors = []
    for name in candidates:
        try:
            resolve(name, cache)
            return name
        except ValueError as e:
            errors.append(f"{name}: {e}")
    raise KVLayoutError("the KV cache matches no registry layout: " + "; ".join(errors))


def paged_kv_from_vllm(kv_caches: dict, layout: str | None = None) -> PagedKVCache:
    """The caches vLLM registered (``register_kv_caches``), layers in model order, as an ops
    PagedKVCache. ``layout`` None picks it from the platform (probing the CPU's)."""
    names = sorted(kv_caches, key=vllm_compat.layer_index)
    caches = [kv_caches[n] for n in names]
    if not caches:
        raise KVLayoutError("no KV cache layers were registered")
    if layout is None:
        if isinstance(caches[0], (tuple, list)):
            caches = _ascend_pairs(caches)
            layout = probe_ascend_layout(*caches[0])
        elif vllm_compat.is_cpu_platform():
            layout = probe_cpu_layout(caches[0])
        else:
            layout = _by_strides(caches[0], GPU_CANDIDATES)
    if layout not in KV_CACHE_LAYOUTS:
        raise KVLayoutError(f"unknown KV cache layout {layout!r}; registry layouts: "
                            f"{', '.join(KV_CACHE_LAYOUTS)}")
    try:
        return PagedKVCache.build(layout, caches)
    except ValueError as e:
        raise KVLayoutError(f"the registered KV caches are not {layout}: {e}") from None
