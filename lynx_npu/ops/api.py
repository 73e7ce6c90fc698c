"""The Lynx op set: one function per operation, the same for every backend.

    anchor, residual = compress(k, v, cfg)                      # k, v: [H, T, D]
    k, v = decompress(anchor, None, cfg, (H, T, D), dtype)      # anchor stage
    k, v = decompress(anchor, residual, cfg, (H, T, D), dtype)  # full stage
    decompress_paged(anchor, residual, cfg, T, kv_cache, slot_mapping, "vllm_cpu")
    k, v = decompress_page(a_page, r_page, cfg, t0, t1, num_kv_heads=H, head_dim=D, dtype=dt)

``anchor`` / ``residual`` are uint8 buffers byte-identical to ``LynxCodec(cfg).encode(k, v)``
with ``scalar_preview`` off (the kernel layout, codec/lynx_layout.py): every page's buffer back
to back (page plans: ops/plan.py). The codec's scalar-preview streams convert to and from it
with ``LynxCodec.layer_to_stream`` / ``layer_from_stream`` (pages: ``kernel_page``). Pages are independent, so the
transport can decompress each page as it lands (``decompress_page*``). The backend follows the
tensors' device (ops/backends.py); pass ``backend=`` or set ``LYNX_BACKEND`` to force one.
"""
from __future__ import annotations

import inspect

import torch

from lynx_npu.codec.base import check_finite
from lynx_npu.codec.lynx_config import LynxConfig
from lynx_npu.codec.lynx_ref import range_error

from . import backends, dest as _dest
from .kv_layouts import KVCacheLayout, resolve
from .plan import LayerPlan, layer_plan, page_plan

KV_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_config(config) -> LynxConfig:
    if not isinstance(config, LynxConfig):
        raise ValueError(f"config must be a LynxConfig, got {type(config).__name__}")
    return config


def _check_kv(k: torch.Tensor, v: torch.Tensor) -> None:
    for name, x in (("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(f"{name} must be a [num_kv_heads, num_tokens, head_dim] tensor, got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
        if x.dtype not in KV_DTYPES:
            raise ValueError(f"{name} has dtype {x.dtype}; expected float16, bfloat16 or float32")
        if min(x.shape) < 1:
            raise ValueError(f"{name} has an empty axis: shape {tuple(x.shape)}")
    if k.shape != v.shape or k.dtype != v.dtype or k.device != v.device:
        raise ValueError(f"k and v must share shape, dtype and device: k {tuple(k.shape)} "
                         f"{k.dtype} {k.device}, v {tuple(v.shape)} {v.dtype} {v.device}")


def check_values(k: torch.Tensor, v: torch.Tensor) -> None:
    """Refuse input no encoding carries, as the reference codec does (ValueError naming it):
    NaN or Inf, or a range past float32 (lynx_ref.range_error; here over the whole tensor,
    which the reference and the CPU kernel check per page channel: only inputs spanning
    more than 2**128 can tell the difference). One aminmax pass over k and over v and one
    device sync: on a GPU it stalls the stream's pipelining (docs/codec.md gives the cost)."""
    ends = torch.stack([*torch.aminmax(k.detach()), *torch.aminmax(v.detach())]).cpu().float()
    for i, (name, x) in enumerate((("k", k), ("v", v))):
        lo, hi = ends[2 * i], ends[2 * i + 1]
        if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
            check_finite(name, x)  # raises, naming the first non-finite value
        if not bool(torch.isfinite(hi - lo)):  # float32 arithmetic, as the kernels'
            raise ValueError(range_error(name, x))


def check_input(impl, k: torch.Tensor, v: torch.Tensor) -> None:
    """``check_values`` unless backend ``impl`` refuses such input itself (CHECKS_VALUES: the
    CPU kernel flags it in its first pass over the values, the torch backend is the
    reference codec, which validates)."""
    if not getattr(impl, "CHECKS_VALUES", False):
        check_values(k, v)


def _check_buffer(name: str, buf, optional: bool = False) -> None:
    if (buf is None and optional) or isinstance(buf, torch.Tensor):
        return
    raise ValueError(f"{name} must be a 1-D uint8 tensor{' or None' if optional else ''}, got "
                     f"{type(buf).__name__}")


def _check_stream(name: str, buf, nbytes: int, device) -> torch.Tensor:
    if not isinstance(buf, torch.Tensor) or buf.dtype != torch.uint8 or buf.dim() != 1:
        raise ValueError(f"{name} must be a 1-D uint8 tensor, got "
                         f"{getattr(buf, 'dtype', type(buf).__name__)} "
                         f"{tuple(getattr(buf, 'shape', ()))}")
    if buf.numel() != nbytes:
        raise ValueError(f"{name} has {buf.numel()} bytes; the layout needs {nbytes}")
    if buf.device != device:
        raise ValueError(f"{name} is on {buf.device}, the other tensors on {device}")
    # Typed views of the buffer (gamma, stats, sinks) need an aligned, dense start.
    if not buf.is_contiguous() or buf.storage_offset() % 16:
        buf = buf.clone()
    return buf


def _check_out_stream(name, buf, nbytes, device) -> None:
    if not isinstance(buf, torch.Tensor) or buf.dtype != torch.uint8 or buf.dim() != 1 \
            or not buf.is_contiguous() or buf.numel() != nbytes or buf.device != device:
        raise ValueError(f"out {name} must be a contiguous 1-D uint8 tensor of {nbytes} bytes on "
                         f"{device}, got {getattr(buf, 'dtype', type(buf).__name__)} "
                         f"{tuple(getattr(buf, 'shape', ()))} on {getattr(buf, 'device', None)}")


def compress(k: torch.Tensor, v: torch.Tensor, config: LynxConfig, *,
             backend: str | None = None, out: tuple[torch.Tensor, torch.Tensor] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Compress one layer. -> (anchor, residual) uint8 buffers on k's device.

    ``out``: preallocated (anchor, residual) buffers of the plan's sizes to write into (every
    byte is written, alignment padding included).
    """
    cfg = _check_config(config)
    _check_kv(k, v)
    h, t, d = k.shape
    plan = layer_plan(cfg, h, t, d, k.dtype)
    if out is not None:
        _check_out_stream("anchor", out[0], plan.anchor_nbytes, k.device)
        _check_out_stream("residual", out[1], plan.residual_nbytes, k.device)
    _, impl = backends.select(k.device, backend, cfg, h, d, k.dtype)
    check_input(impl, k, v)
    if out is None:
        return impl.compress(k, v, plan)
    if "out" in inspect.signature(impl.compress).parameters:
        return impl.compress(k, v, plan, out=out)
    anchor, residual = impl.compress(k, v, plan)
    out[0].copy_(anchor)
    out[1].copy_(residual)
    return out


def _run_decompress(anchor, residual, plan: LayerPlan, dest, backend) -> None:
    device = dest.device
    anchor = _check_stream("anchor", anchor, plan.anchor_nbytes, device)
    if residual is not None:
        residual = _check_stream("residual", residual, plan.residual_nbytes, device)
    _, impl = backends.select(device, backend, plan.config, plan.num_kv_heads, plan.head_dim,
                              plan.dtype)
    if dest.tiled and not getattr(impl, "WRITES_TILES", False):  # a dense pair, then a scatter
        k = torch.empty(plan.num_kv_heads, plan.num_tokens, plan.head_dim, dtype=dest.dtype,
                        device=device)
        v = torch.empty_like(k)
        impl.decompress(anchor, residual, plan, _dest.dense(k, v))
        _dest.scatter_tokens(dest, 0, k, v, plan.num_kv_heads, plan.head_dim)
        return
    impl.decompress(anchor, residual, plan, dest)


def _check_shape(shape) -> tuple[int, int, int]:
    try:
        dims = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        dims = ()
    if len(dims) != 3 or min(dims) < 1:
        raise ValueError(f"shape must be [num_kv_heads, num_tokens, head_dim] > 0, got {shape!r}")
    return dims


def decompress(anchor: torch.Tensor, residual: torch.Tensor | None, config: LynxConfig,
               shape, dtype: torch.dtype, *, backend: str | None = None,
               out: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Anchor-only (``residual=None``) or full decompression of one layer -> (k, v) [H, T, D].

    ``out``: (k, v) tensors of ``shape`` and ``dtype`` (any strides) to write into.
    """
    cfg = _check_config(config)
    _check_buffer("anchor", anchor)
    _check_buffer("residual", residual, optional=True)
    h, t, d = _check_shape(shape)
    if dtype not in KV_DTYPES:
        raise ValueError(f"{dtype=} must be float16, bfloat16 or float32")
    plan = layer_plan(cfg, h, t, d, dtype)
    if out is None:
        k = torch.empty(h, t, d, dtype=dtype, device=anchor.device)
        v = torch.empty_like(k)
    else:
        k, v = out
        for name, x in (("k", k), ("v", v)):
            if not isinstance(x, torch.Tensor) or tuple(x.shape) != (h, t, d) or x.dtype != dtype:
                raise ValueError(f"out {name} must be a {dtype} tensor of shape {(h, t, d)}, got "
                                 f"{getattr(x, 'dtype', None)} {tuple(getattr(x, 'shape', ()))}")
    _run_decompress(anchor, residual, plan, _dest.dense(k, v), backend)
    return k, v


def _check_slots(slot_mapping, num_tokens: int, cache) -> torch.Tensor:
    if not isinstance(slot_mapping, torch.Tensor) or slot_mapping.dim() != 1 \
            or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError("slot_mapping must be a 1-D int32/int64 tensor")
    if slot_mapping.numel() != num_tokens:
        raise ValueError(f"slot_mapping has {slot_mapping.numel()} entries for {num_tokens} tokens")
    top = cache.num_blocks * cache.block_size
    # Bounds are checked where that is free: a slot_mapping on the host. Reading a device
    # tensor back would stall the stream on every layer (a device sync per call), so there the
    # kernels skip slots past the cache instead of writing outside it, as negative ones.
    if slot_mapping.device.type == "cpu" and num_tokens and int(slot_mapping.max()) >= top:
        raise ValueError(f"slot_mapping holds slot {int(slot_mapping.max())}; the cache has "
                         f"{top} slots")
    return slot_mapping.to(device=cache.k.tensor.device, dtype=torch.int64).contiguous()


def decompress_paged(anchor: torch.Tensor, residual: torch.Tensor | None, config: LynxConfig,
                     num_tokens: int, kv_caches, slot_mapping: torch.Tensor,
                     layout: str | KVCacheLayout, *, backend: str | None = None) -> None:
    """Decompress one layer straight into a paged KV cache: token t -> slot_mapping[t].

    ``kv_caches`` is one tensor or (k_cache, v_cache), as ``layout`` (ops/kv_layouts.py)
    describes; the stream's dtype is the cache's. Tokens with a negative slot (vLLM's padding)
    are skipped. A slot past the cache raises ValueError when ``slot_mapping`` is on the host;
    a device ``slot_mapping`` is not read back (that would synchronise the stream on every
    layer), and such tokens are skipped, never written outside the cache.
    """
    cfg = _check_config(config)
    cache = resolve(layout, kv_caches)
    plan = layer_plan(cfg, cache.num_kv_heads, int(num_tokens), cache.head_size, cache.dtype)
    slots = _check_slots(slot_mapping, plan.num_tokens, cache)
    _run_decompress(anchor, residual, plan, _dest.paged(cache, slots), backend)


def decompress_page(anchor: torch.Tensor, residual: torch.Tensor | None, config: LynxConfig,
                    token_start: int, token_end: int, *, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype, backend: str | None = None):
    """One page buffer (tokens [token_start, token_end) of the layer) -> (k, v) [H, n, D]."""
    cfg = _check_config(config)
    _check_buffer("anchor", anchor)
    _check_buffer("residual", residual, optional=True)
    plan = page_plan(cfg, num_kv_heads, head_dim, dtype, token_start, token_end)
    k = torch.empty(num_kv_heads, plan.num_tokens, head_dim, dtype=dtype, device=anchor.device)
    v = torch.empty_like(k)
    _run_decompress(anchor, residual, plan, _dest.dense(k, v), backend)
    return k, v


def decompress_page_paged(anchor: torch.Tensor, residual: torch.Tensor | None,
                          config: LynxConfig, token_start: int, token_end: int, kv_caches,
                          slot_mapping: torch.Tensor, layout: str | KVCacheLayout, *,
                          backend: str | None = None) -> None:
    """One page buffer straight into a paged cache; ``slot_mapping`` covers the page's tokens."""
    cfg = _check_config(config)
    cache = resolve(layout, kv_caches)
    plan = page_plan(cfg, cache.num_kv_heads, cache.head_size, cache.dtype, token_start,
                     token_end)
    slots = _check_slots(slot_mapping, plan.num_tokens, cache)
    _run_decompress(anchor, residual, plan, _dest.paged(cache, slots), backend)


def backend_for(device, config: LynxConfig, num_kv_heads: int, head_dim: int, dtype,
                backend: str | None = None) -> str:
    """The backend name the ops would use for these tensors (raises like the ops do)."""
    return backends.select(torch.device(device), backend, config, num_kv_heads, head_dim,
                           dtype)[0]
