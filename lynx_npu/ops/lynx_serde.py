"""The page serde of the Lynx codecs (lynx, lynx-int4, lynx-int8) on the ops kernels.

Encode: one kernel launch per K / V writes a layer's wire frames straight into one layer
buffer on the cache's device (wire_layout.py places every section; scalar previews come from
the exact stats through a 64K-entry table, so they equal lynx_stream.preview bit for bit), then
one copy stages the buffer to pinned host memory. The gather from the paged cache is fused into
the kernel where the backend reads per-token row offsets (Triton); otherwise a contiguous run
of blocks is read in place and anything else is gathered first. Input no page can carry (NaN,
Inf, a page range past float32) is refused without a pass of its own: the CPU kernel raises
from its first pass; the Triton kernels flag it (ops/value_flags.py), the flags are staged with
the bytes and ``EncodedLayer.wait()`` raises the ValueError naming the layer, head and tokens.

Decode: the received frames of a layer are staged into one buffer (pinned, then one
non-blocking copy where the cache is on a device; anchor-only pages get their stats expanded
from the previews on the host), and one launch per K / V and stage decompresses them straight
into the paged cache at their slots.

Backends whose kernels read every section from the plan table (cpu, triton) take these
layouts directly; any other backend (Ascend C, the torch reference) runs the codec's own
encode_pages / decode_page, which give the same bytes.
"""
from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from lynx_npu.codec.base import validate_kv
from lynx_npu.codec.lynx_layout import SCALAR_DTYPE
from lynx_npu.codec.lynx_layout import stream_layout
from lynx_npu.codec.lynx_stream import (preview, preview_levels, trim_residual, window_of,
                                        window_residual, window_tail)

from . import backends, value_flags
from .api import _check_kv, _check_slots
from .dest import Destination, dense, paged, scatter_tokens
from .kv_layouts import ResolvedCache
from .layered import page_layer_offsets, request_plan, request_rows
from .page_serde import EncodedLayer, PageSerde, WirePage, as_bytes, wire_pages
from .paged_cache import (PagedKVCache, dense_run, is_tiled, read_tokens, row_align,
                          row_offsets)
from .plan import (F_BODY0, F_NUM_BODY, F_NUM_SINK, F_SECTION, F_TOKEN0, NUM_FIELDS, SECTIONS,
                   LayerPlan)
from .staging import DeviceCopier
from .wire_layout import SCRATCH, VARIANTS, LayerWire, layer_wire, page_wire, received_span

LYNX_VARIANTS = VARIANTS
# Backends whose kernels address every section through the plan table (ops/plan.py).
PLAN_TABLE_BACKENDS = frozenset({"cpu", "triton"})


def _up(n: int, a: int = 32) -> int:
    return (n + a - 1) // a * a


@functools.lru_cache(maxsize=None)
def _preview_table_host(grid: str) -> torch.Tensor:
    """uint8 [2, 65536]: the byte of every float16 bit pattern as mu (row 0) and as sigma
    (row 1) on scalar grid ``grid``, by lynx_stream.preview itself."""
    values = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(SCALAR_DTYPE)
    return preview(torch.stack([values, values]), grid).contiguous()


_TABLES: dict[tuple[str, str], torch.Tensor] = {}


def preview_table(device, grid: str) -> torch.Tensor:
    key = (str(torch.device(device)), grid)
    if key not in _TABLES:
        _TABLES[key] = _preview_table_host(grid).to(device)
    return _TABLES[key]


@functools.lru_cache(maxsize=None)
def _levels_f16(grid: str) -> np.ndarray:
    """float16 [2, 256] as uint16 bits: what each byte expands to (lynx_stream.expand)."""
    return preview_levels(grid).to(SCALAR_DTYPE).view(torch.int16).numpy().view(np.uint16)


@dataclass
class DeviceLayers:
    """A request's layers compressed on the device in one launch, not yet staged to the host
    (``compress_layers``; ``stage_layers`` makes their wire pages)."""

    buffer: torch.Tensor          # the layers' wire buffers back to back, on the device
    wire: LayerWire               # one layer's layout (layer i at i * wire.nbytes)
    num_layers: int
    backend: str
    flags: torch.Tensor | None    # the kernels' record of bad input (ops/value_flags.py)


@dataclass
class StagedPages:
    """Received pages of one layer in one buffer on the destination device."""

    buffer: torch.Tensor
    groups: list          # (LayerPlan, full, layer of each page) per stage present
    pages: list           # the WirePages (the reference fallback decodes them)
    relative: int         # token of the plan's token 0
    num_tokens: int = 0   # the tokens the pages reach (relative)
    _offsets: dict = field(default_factory=dict)  # apply_layers: per-cache layer offsets


class LynxSerde(PageSerde):
    def __init__(self, codec, backend: str | None = None):
        super().__init__(codec, backend)
        self.config = codec.config
        self.kernel_config = codec.config.kernel
        self._copiers: dict[str, DeviceCopier] = {}

    # -- sizes and backends --------------------------------------------------------------------
    def page_nbytes(self, num_tokens, num_kv_heads, head_dim, dtype):
        lw = layer_wire(self.name, self.config, num_kv_heads, num_tokens, head_dim, dtype)
        return [(pw.span.token_start, pw.span.token_end, pw.frames[0],
                 pw.frames[1] if len(pw.frames) > 1 else None) for pw in lw.pages]

    def _select(self, device, num_kv_heads, head_dim, dtype):
        return backends.select(torch.device(device), self.backend, self.kernel_config,
                               num_kv_heads, head_dim, dtype)

    def compress_backend(self, device, num_kv_heads, head_dim, dtype) -> str:
        return self._select(device, num_kv_heads, head_dim, dtype)[0]

    decompress_backend = compress_backend

    def _copier(self, device) -> DeviceCopier:
        key = str(torch.device(device))
        if key not in self._copiers:
            self._copiers[key] = DeviceCopier(torch.device(device))
        return self._copiers[key]

    # -- encode --------------------------------------------------------------------------------
    def encode(self, k: torch.Tensor, v: torch.Tensor) -> EncodedLayer:
        if not isinstance(k, torch.Tensor) or k.device.type == "cpu":
            validate_kv(k, v)  # as encode_pages: named errors, finite values only (host)
        _check_kv(k, v)  # on a device the kernel flags what is not finite (no pass of its own)
        h, t, d = k.shape
        name, impl = self._select(k.device, h, d, k.dtype)
        if name not in PLAN_TABLE_BACKENDS:
            return self._reference(k, v, name)  # encode_pages validates
        lw = layer_wire(self.name, self.config, h, t, d, k.dtype)
        flags = self._new_flags(impl, k.device)
        return self.to_wire(self.compress(impl, k, v, lw, flags=flags), lw, name, flags)

    def encode_cache(self, cache: ResolvedCache, slot_mapping: torch.Tensor) -> EncodedLayer:
        dev = cache.k.tensor.device
        name, impl = self._select(dev, cache.num_kv_heads, cache.head_size, cache.dtype)
        flags = self._new_flags(impl, dev) if name in PLAN_TABLE_BACKENDS else None
        buf, lw, name = self.compress_cache(cache, slot_mapping, flags=flags)
        if lw is None:
            return buf  # the reference fallback made the pages already
        return self.to_wire(buf, lw, name, flags)

    @staticmethod
    def _new_flags(impl, device) -> torch.Tensor | None:
        """A flags buffer (ops/value_flags.py) where the backend's compress writes one, else
        None (the backend raises itself: the CPU kernel from its first pass)."""
        if "flags" in inspect.signature(impl.compress).parameters:
            return value_flags.new(device)
        return None

    def _layered(self, impl, cache: PagedKVCache) -> bool:
        """Whether one launch can take every layer (the kernels read row / layer offsets)."""
        return (cache.num_layers > 1 and not cache.tiled and cache.layer_offsets is not None
                and "rows" in inspect.signature(impl.compress).parameters
                and "layer_offsets" in inspect.signature(impl.decompress).parameters
                and cache.layer(0).k.s_block % 2 == 0)

    def encode_layers(self, cache: PagedKVCache, slot_mapping: torch.Tensor):
        layers = self.compress_layers(cache, slot_mapping)
        if layers is None:
            yield from super().encode_layers(cache, slot_mapping)
            return
        yield from self.stage_layers(layers)

    def compress_layers(self, cache: PagedKVCache, slot_mapping: torch.Tensor
                        ) -> DeviceLayers | None:
        """Every layer of a request in one launch per K / V, on the device (None where the
        backend cannot: ``encode_layers`` then goes layer by layer)."""
        h, d, dtype = cache.num_kv_heads, cache.head_size, cache.dtype
        name, impl = self._select(cache.device, h, d, dtype)
        if name not in PLAN_TABLE_BACKENDS or not self._layered(impl, cache):
            return None
        flags = self._new_flags(impl, cache.device)
        buf, lw = self.compress_request(impl, cache, slot_mapping, flags=flags)
        return DeviceLayers(buf, lw, cache.num_layers, name, flags)

    def stage_layers(self, layers: DeviceLayers) -> list[EncodedLayer]:
        """One copy of ``compress_layers``' buffer (and flags) to pinned host memory -> each
        layer's pages; their ``wait()`` raises what the flags record, for the request."""
        buf, lw, flags = layers.buffer, layers.wire, layers.flags
        staged = self._copier(buf.device).to_host(buf, flags)
        ready = self._ready(staged, flags, request_plan(lw, layers.num_layers, buf.device)[0],
                            lw.num_tokens)
        raw = staged.host.numpy()
        return [self._pages(raw, i * lw.nbytes, lw, layers.backend, ready)
                for i in range(layers.num_layers)]

    def compress_request(self, impl, cache: PagedKVCache, slot_mapping: torch.Tensor,
                         out: torch.Tensor | None = None, flags: torch.Tensor | None = None):
        """Every layer in one launch per K / V -> (the layers' buffers back to back on the
        device, the LayerWire of one layer). ``flags`` (value_flags.new): the kernels' record
        of bad input, for the caller to read (``_ready``); without them the launch is checked
        at once (a sync)."""
        rc0 = cache.layer(0)
        n = slot_mapping.numel()
        slots = _check_slots(slot_mapping, n, rc0)
        lw = layer_wire(self.name, self.config, cache.num_kv_heads, n, cache.head_size,
                        cache.dtype)
        plan, prev = request_plan(lw, cache.num_layers, slots.device)
        bases = [torch.as_strided(t.tensor, (cache.num_kv_heads, cache.block_size,
                                             cache.head_size), (t.s_head, t.s_token, t.s_dim),
                                  t.tensor.storage_offset() + t.offset) for t in (rc0.k, rc0.v)]
        buf = out if out is not None else torch.empty(plan.anchor_nbytes, dtype=torch.uint8,
                                                      device=slots.device)
        kw = ({"previews": (prev, preview_table(slots.device, self.config.scalar_grid))}
              if prev is not None else {})
        align = row_align(rc0, *cache.layer_offsets[0], *cache.layer_offsets[1])
        if flags is not None:
            kw["flags"] = flags
        impl.compress(*bases, plan, out=(buf, buf), rows=request_rows(cache, slots),
                      row_align=align, **kw)
        for i in range(cache.num_layers):
            for off, size in lw.extra_pads:
                buf[i * lw.nbytes + off:i * lw.nbytes + off + size].zero_()
        return buf, lw

    def compress_cache(self, cache: ResolvedCache, slot_mapping: torch.Tensor,
                       flags: torch.Tensor | None = None):
        """-> (layer buffer on the cache's device, its LayerWire, backend); the bytes are on
        the device only (``to_wire`` stages them, with ``flags``: see ``compress``)."""
        n = slot_mapping.numel() if isinstance(slot_mapping, torch.Tensor) else 0
        slots = _check_slots(slot_mapping, n, cache)
        if n == 0 or (slot_mapping.device.type == "cpu" and int(slot_mapping.min()) < 0):
            raise ValueError(f"encode needs one valid slot per token; got {n} slots"
                             + (f", min {int(slot_mapping.min())}" if n else ""))
        h, d, dtype = cache.num_kv_heads, cache.head_size, cache.dtype
        dev = cache.k.tensor.device
        name, impl = self._select(dev, h, d, dtype)
        if name not in PLAN_TABLE_BACKENDS:
            return self._reference(*read_tokens(cache, slots), name), None, name
        lw = layer_wire(self.name, self.config, h, slots.numel(), d, dtype)
        run = dense_run(cache, slot_mapping) if slot_mapping.device.type == "cpu" else None
        if run is not None:
            return self.compress(impl, *run, lw, flags=flags), lw, name
        if ("rows" in inspect.signature(impl.compress).parameters and cache.k.s_block % 2 == 0
                and not is_tiled(cache)):
            bases = [torch.as_strided(t.tensor, (h, cache.block_size, d),
                                      (t.s_head, t.s_token, t.s_dim),
                                      t.tensor.storage_offset() + t.offset)
                     for t in (cache.k, cache.v)]
            return self.compress(impl, *bases, lw, rows=row_offsets(cache, slots),
                                 row_align=row_align(cache), flags=flags), lw, name
        return self.compress(impl, *read_tokens(cache, slots), lw, flags=flags), lw, name

    def compress(self, impl, k, v, lw: LayerWire, rows=None,
                 out: torch.Tensor | None = None, row_align: int = 1,
                 flags: torch.Tensor | None = None) -> torch.Tensor:
        """Run the kernel into a layer buffer (``out``, reused, or a new one): every wire byte
        is written (pads zeroed). ``flags`` (value_flags.new, backends whose compress takes
        them): written by the kernel, read by the caller (``to_wire``); without them such a
        backend checks its launch at once (one sync) and raises."""
        buf = out if out is not None else torch.empty(lw.nbytes, dtype=torch.uint8,
                                                      device=k.device)
        if buf.dtype != torch.uint8 or buf.numel() != lw.nbytes or buf.device != k.device:
            raise ValueError(f"out must be {lw.nbytes} uint8 bytes on {k.device}, got "
                             f"{buf.numel()} {buf.dtype} on {buf.device}")
        params = inspect.signature(impl.compress).parameters
        kw = {} if rows is None else {"rows": rows, "row_align": row_align}
        if flags is not None:
            kw["flags"] = flags
        fused_previews = lw.preview_offsets is not None and "previews" in params
        if fused_previews:
            kw["previews"] = (lw.previews_on(k.device),
                              preview_table(k.device, self.config.scalar_grid))
        impl.compress(k, v, lw.plan, out=(buf, buf), **kw)
        for off, n in lw.extra_pads:
            buf[off:off + n].zero_()
        if lw.preview_offsets is not None and not fused_previews:
            _write_previews(buf, lw)
        return buf

    def to_wire(self, buf: torch.Tensor, lw: LayerWire, backend: str,
                flags: torch.Tensor | None = None) -> EncodedLayer:
        """Stage a layer buffer (and the kernel's ``flags``) to host memory -> its pages, whose
        ``wait()`` raises the ValueError of what the flags record."""
        staged = self._copier(buf.device).to_host(buf, flags)
        return self._pages(staged.host.numpy(), 0, lw, backend,
                           self._ready(staged, flags, lw.plan))

    @staticmethod
    def _ready(staged, flags, plan: LayerPlan, tokens_per_layer: int | None = None):
        """The pages' ``wait``: the staged bytes, then the flags read (landed with them)."""
        if flags is None:
            return staged.wait

        def ready():
            staged.wait()
            err = value_flags.error(staged.small, plan, tokens_per_layer)
            if err is not None:
                raise err
        return ready

    @staticmethod
    def _pages(raw: np.ndarray, base: int, lw: LayerWire, backend: str, ready) -> EncodedLayer:
        """The wire pages of the layer at ``raw[base:]`` (views: nothing is read yet; the
        recent-token windows are filled in once the bytes have landed)."""
        pages, whole = [], memoryview(raw)  # slices of one view: no buffer export each
        for p, pw in enumerate(lw.pages):
            frames = [whole[base + o:base + o + n] for o, n in
                      (lw.frame(p, f) for f in range(len(pw.frames)))]
            pages.append(WirePage(p, pw.span.token_start, pw.span.token_end, frames[0],
                                  frames[1] if len(frames) > 1 else None))
        if any(pw.window[0] for pw in lw.pages):
            landed = ready

            def ready():
                if landed is not None:
                    landed()
                _fill_windows(raw, base, lw)
        return EncodedLayer(pages, backend, ready)

    def _reference(self, k, v, backend: str) -> EncodedLayer:
        pages = [type(p)(p.index, p.token_start, p.token_end, p.anchor.cpu(),
                         p.residual.cpu() if p.residual is not None else None)
                 for p in self.codec.encode_pages(k, v)]
        return EncodedLayer(wire_pages(pages), f"reference ({backend} cannot write wire "
                                                f"frames)" if backend != "torch" else "torch")

    # -- decode --------------------------------------------------------------------------------
    def decode_page(self, anchor, residual, token_start, token_end, *, num_kv_heads, head_dim,
                    dtype):
        page = WirePage(-1, token_start, token_end, as_bytes(anchor),
                        as_bytes(residual) if residual is not None else None)
        n = token_end - token_start
        k = torch.empty(num_kv_heads, n, head_dim, dtype=dtype)
        v = torch.empty_like(k)
        staged = self.stage([page], torch.device("cpu"), num_kv_heads, head_dim, dtype,
                            relative=token_start)
        self.apply(staged, dense(k, v), num_kv_heads, head_dim)
        return k, v

    def decode_into(self, pages: Sequence[WirePage], cache: ResolvedCache,
                    slot_mapping: torch.Tensor, wire_dtype: torch.dtype | None = None) -> str:
        if not pages:
            return "none"
        if wire_dtype is not None and wire_dtype != cache.dtype:
            return self._decode_cast(pages, cache, slot_mapping, wire_dtype)
        num_tokens = max(p.token_end for p in pages)
        if slot_mapping.numel() < num_tokens:
            raise ValueError(f"slot_mapping has {slot_mapping.numel()} slots; the pages reach "
                             f"token {num_tokens}")
        slots = _check_slots(slot_mapping[:num_tokens], num_tokens, cache)
        staged = self.stage(pages, cache.k.tensor.device, cache.num_kv_heads, cache.head_size,
                            cache.dtype)
        return self.apply(staged, paged(cache, slots), cache.num_kv_heads, cache.head_size)

    def _decode_cast(self, pages: Sequence[WirePage], cache: ResolvedCache,
                     slot_mapping: torch.Tensor, wire_dtype: torch.dtype) -> str:
        """Pages of another dtype than the cache's (bf16 pages into vLLM's float32 CPU cache):
        pages that cover one run of tokens decode in one launch into a dense [H, T, D] of
        their dtype, then one cast and one scatter, instead of one of each per page (the
        demo's residual took 0.13-0.19 s to refine that way, 30 layers x 6 pages)."""
        ordered = sorted(pages, key=lambda p: p.token_start)
        lo, hi = ordered[0].token_start, ordered[-1].token_end
        if any(a.token_end != b.token_start for a, b in zip(ordered, ordered[1:])):
            return super()._decode_cast(pages, cache, slot_mapping, wire_dtype)
        h, d = cache.num_kv_heads, cache.head_size
        k = torch.empty(h, hi - lo, d, dtype=wire_dtype)
        v = torch.empty_like(k)
        staged = self.stage(ordered, torch.device("cpu"), h, d, wire_dtype, relative=lo)
        used = self.apply(staged, dense(k, v), h, d)
        dest = paged(cache, slot_mapping.to(cache.k.tensor.device, torch.int64))
        scatter_tokens(dest, lo, k.to(dest.device), v.to(dest.device), h, d)
        return f"{used} ({str(wire_dtype).split('.')[-1]} pages cast to the " \
               f"{str(cache.dtype).split('.')[-1]} cache)"

    def decode_layers(self, pages, cache: PagedKVCache, slot_mapping: torch.Tensor,
                      wire_dtype: torch.dtype | None = None) -> str:
        h, d, dtype = cache.num_kv_heads, cache.head_size, cache.dtype
        name, impl = self._select(cache.device, h, d, dtype)
        if (name not in PLAN_TABLE_BACKENDS or not self._layered(impl, cache)
                or (wire_dtype is not None and wire_dtype != dtype) or len(pages) < 2):
            return super().decode_layers(pages, cache, slot_mapping, wire_dtype)
        flat = [(layer, p) for layer, ps in sorted(pages.items()) for p in ps]
        staged = self.stage([p for _, p in flat], cache.device, h, d, dtype,
                            layers=[layer for layer, _ in flat])
        return self.apply_layers(staged, cache, slot_mapping)

    def apply_layers(self, staged: StagedPages, cache: PagedKVCache,
                     slot_mapping: torch.Tensor) -> str:
        """Staged pages of several layers into the cache: one launch per K / V and stage."""
        num_tokens = staged.num_tokens
        if slot_mapping.numel() < num_tokens:
            raise ValueError(f"slot_mapping has {slot_mapping.numel()} slots; the pages reach "
                             f"token {num_tokens}")
        rc0 = cache.layer(0)
        slots = _check_slots(slot_mapping[:num_tokens], num_tokens, rc0)
        name, impl = self._select(cache.device, cache.num_kv_heads, cache.head_size,
                                  cache.dtype)
        offsets = staged._offsets.get(id(cache))
        if offsets is None:  # (the staged pages keep the cache alive while they are cached)
            offsets = [page_layer_offsets(cache, layers, cache.device)
                       for _, _, layers in staged.groups]
            staged._offsets[id(cache)] = offsets = (cache, offsets)
        align = math.gcd(*cache.layer_offsets[0], *cache.layer_offsets[1])
        for (plan, full, _), lay in zip(staged.groups, offsets[1]):
            impl.decompress(staged.buffer, staged.buffer if full else None, plan,
                            paged(rc0, slots), layer_offsets=lay, layer_align=align)
        return name

    def stage(self, pages: Sequence[WirePage], device, num_kv_heads: int, head_dim: int,
              dtype: torch.dtype, relative: int = 0, layers: Sequence[int] | None = None
              ) -> StagedPages:
        """Check the pages' sizes and copy their frames into one buffer on ``device``."""
        cfg, placed, off = self.config, [], 0
        for p in pages:
            span = received_span(cfg, p.token_start, p.token_end)
            frames = [as_bytes(p.anchor)]
            try:
                rows = self._window_of(frames[0], span, num_kv_heads, head_dim, dtype)
            except ValueError as e:
                raise ValueError(f"anchor frame of page [{p.token_start}, {p.token_end}): "
                                 f"{e}") from None
            pw = page_wire(self.name, cfg, num_kv_heads, head_dim, dtype, span, rows)
            if len(pw.frames) == 1 and p.residual is not None:
                raise ValueError(f"{self.name} sends one stream; page [{p.token_start}, "
                                 f"{p.token_end}) came with a residual")
            if p.residual is not None:
                frames.append(as_bytes(p.residual))
            for i, (f, want) in enumerate(zip(frames, pw.frames)):
                if len(f) != want:
                    raise ValueError(f"{('anchor', 'residual')[i]} frame of page "
                                     f"[{p.token_start}, {p.token_end}) has {len(f)} bytes; "
                                     f"{self.name} needs {want}")
            if rows:  # the kernels read the page's whole residual: the window's rows put back
                # (anchor stage: those alone); its sections sit where a window-less page's do
                frames[1:] = [memoryview(self._window_residual(
                    frames[0], span, num_kv_heads, head_dim, dtype, rows,
                    frames[1] if len(frames) > 1 else None)).cast("B")]
                pw = page_wire(self.name, cfg, num_kv_heads, head_dim, dtype, span)
            full = len(frames) == 2 or self.name == "lynx-int8"
            bases = []
            for f in frames:
                bases.append(off)
                off = _up(off + len(f))
            scratch = {}  # the scalars expanded from the anchor's bytes: anchor-only pages
            if pw.previews and (not full or pw.sections["k_stats"][0] == SCRATCH):  # byte grid
                for w in "kv":
                    scratch[w] = off
                    off = _up(off + pw.stats_nbytes[w])
            placed.append((p, pw, frames, bases, full, scratch))
        host = self._host_buffer(_up(off, 16), device)
        raw = host.numpy()
        rows = {True: [], False: []}
        page_layers = {True: [], False: []}
        for i, (p, pw, frames, bases, full, scratch) in enumerate(placed):
            page_layers[full].append(layers[i] if layers is not None else 0)
            for f, b in zip(frames, bases):
                raw[b:b + len(f)] = np.frombuffer(f, dtype=np.uint8)
            for w, s in scratch.items():
                f0, o = pw.previews[w]
                nb = pw.stats_nbytes[w] // 2
                u = raw[bases[f0] + o:bases[f0] + o + nb].reshape(2, -1)
                lv = _levels_f16(cfg.scalar_grid)
                stats = np.stack([lv[0][u[0]], lv[1][u[1]]])
                raw[s:s + 2 * nb] = stats.reshape(-1).view(np.uint8)
            rows[full].append(_row(pw, bases, full, scratch, relative))
        buf = self._copier(device).to_device(host)
        end = max(p.token_end for p in pages) - relative
        groups = [(LayerPlan(self.kernel_config, num_kv_heads, end, head_dim, dtype, (),
                             buf.numel(), buf.numel(), torch.tensor(r, dtype=torch.int64)),
                   full, page_layers[full]) for full, r in rows.items() if r]
        return StagedPages(buf, groups, list(pages), relative, end)

    def _window_of(self, anchor: memoryview, span, h: int, d: int, dtype) -> int:
        """The recent rows a received anchor frame carries (0 without ``recent_tokens``);
        its size is checked against them (a ValueError names both)."""
        if self.name != "lynx" or not self.config.recent_tokens:
            return 0
        slay = stream_layout(self.config, h, d, dtype, span.num_tokens, span.num_sink)
        if len(anchor) == slay.anchor_nbytes:
            return 0  # no window: nothing to read (the common page)
        return window_of(_host_copy(anchor), slay, self.config, h, d)

    def _window_residual(self, anchor: memoryview, span, h: int, d: int, dtype, rows: int,
                         residual: memoryview | None) -> np.ndarray:
        slay = stream_layout(self.config, h, d, dtype, span.num_tokens, span.num_sink)
        return window_residual(_host_copy(anchor), slay, self.config, h, d, rows,
                               None if residual is None else _host_copy(residual)).numpy()

    def _host_buffer(self, nbytes: int, device) -> torch.Tensor:
        from .staging import host_buffer
        return host_buffer(nbytes, device)

    def apply(self, staged: StagedPages, dest: Destination, num_kv_heads: int,
              head_dim: int) -> str:
        """Decompress staged pages into ``dest`` (one launch per K / V and stage)."""
        name, impl = self._select(dest.device, num_kv_heads, head_dim, dest.dtype)
        if name not in PLAN_TABLE_BACKENDS:
            for p in staged.pages:
                k, v = self.codec.decode_page(
                    torch.frombuffer(bytearray(p.anchor), dtype=torch.uint8),
                    None if p.residual is None else torch.frombuffer(bytearray(p.residual),
                                                                     dtype=torch.uint8),
                    p.token_start, p.token_end, num_kv_heads=num_kv_heads, head_dim=head_dim,
                    dtype=dest.dtype)
                scatter_tokens(dest, p.token_start - staged.relative, k.to(dest.device),
                               v.to(dest.device), num_kv_heads, head_dim)
            return "reference"
        if dest.tiled and not getattr(impl, "WRITES_TILES", False):
            # a kernel that addresses no tiles: a dense pair, then the tokens pages cover
            return self._apply_tiled(impl, name, staged, dest, num_kv_heads, head_dim)
        for plan, full, _ in staged.groups:
            impl.decompress(staged.buffer, staged.buffer if full else None, plan, dest)
        return name

    @staticmethod
    def _apply_tiled(impl, name: str, staged: StagedPages, dest: Destination,
                     num_kv_heads: int, head_dim: int) -> str:
        k = torch.empty(num_kv_heads, staged.num_tokens, head_dim, dtype=dest.dtype,
                        device=dest.device)
        v = torch.empty_like(k)
        for plan, full, _ in staged.groups:
            impl.decompress(staged.buffer, staged.buffer if full else None, plan, dense(k, v))
        for start, end in _covered(staged.pages, staged.relative):
            scatter_tokens(dest, start, k[:, start:end], v[:, start:end], num_kv_heads,
                           head_dim)
        return name


def _row(pw, bases: list[int], full: bool, scratch: dict, relative: int) -> list[int]:
    """A decompress table row for one staged page (absolute offsets in the staging buffer)."""
    row = [0] * NUM_FIELDS
    s = pw.span
    row[F_TOKEN0], row[F_BODY0] = s.token_start - relative, s.body_start - relative
    row[F_NUM_BODY], row[F_NUM_SINK] = s.num_tokens, s.num_sink
    for name, (f, o) in pw.sections.items():
        if f == SCRATCH or f >= len(bases):
            if name.endswith("_stats") and name[0] in scratch:
                row[F_SECTION + SECTIONS.index(name)] = scratch[name[0]]
            continue  # residual codes of an anchor-only page: never read
        row[F_SECTION + SECTIONS.index(name)] = bases[f] + o
    return row


def _covered(pages, relative: int) -> list[tuple[int, int]]:
    """The token ranges (plan-relative) the pages cover, merged where they touch."""
    out: list[list[int]] = []
    for p in sorted(pages, key=lambda p: p.token_start):
        a, b = p.token_start - relative, p.token_end - relative
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _runs(lw: LayerWire):
    """Maximal runs of consecutive pages with the same layout (evenly spaced frames)."""
    runs, first = [], 0
    shape = [(pw.frames, pw.sections, pw.previews) for pw in lw.pages]
    for p in range(1, len(lw.pages) + 1):
        if p == len(lw.pages) or shape[p] != shape[first]:
            runs.append((first, p - first))
            first = p
    return runs


def _offset(lw: LayerWire, page: int, where: tuple[int, int]) -> int:
    """A section's byte offset in the layer buffer from its (frame or SCRATCH, offset)."""
    f, o = where
    return (lw.scratch_offsets[page] if f == SCRATCH else lw.frame_offsets[page][f]) + o


def _preview_steps(lw: LayerWire, first: int, count: int, w: str):
    """-> (stats offset, preview offset, their strides) over a run of pages."""
    pw = lw.pages[first]
    src = [_offset(lw, first + i, pw.sections[w + "_stats"]) for i in range(min(count, 2))]
    dst = [_offset(lw, first + i, pw.previews[w]) for i in range(min(count, 2))]
    return src[0], dst[0], src[-1] - src[0], dst[-1] - dst[0]


def _write_previews(buf: torch.Tensor, lw: LayerWire) -> None:
    """The anchor's scalar bytes from the float16 stats the kernel wrote (backends without the
    fused store)."""
    if buf.device.type == "cpu":
        return _write_previews_host(buf.numpy(), lw)
    tab = preview_table(buf.device, lw.config.scalar_grid)
    b16 = buf.view(torch.int16)
    for first, count in _runs(lw):
        pw = lw.pages[first]
        for w in "kv":
            nc = pw.stats_nbytes[w] // 4
            if nc == 0:
                continue
            src0, dst0, s_step, d_step = _preview_steps(lw, first, count, w)
            bits = torch.as_strided(b16, (count, 2, nc), (s_step // 2, nc, 1), src0 // 2)
            idx = bits.to(torch.int64) & 0xFFFF
            u = torch.stack([tab[0][idx[:, 0]], tab[1][idx[:, 1]]], dim=1)
            torch.as_strided(buf, (count, 2, nc), (d_step, nc, 1), dst0).copy_(u)


def _write_previews_host(raw: np.ndarray, lw: LayerWire) -> None:
    """_write_previews on a host buffer, with numpy (a table lookup by float16 bits)."""
    tab = _preview_table_host(lw.config.scalar_grid).numpy()
    raw16 = raw[:raw.size // 2 * 2].view(np.uint16)
    strided = np.lib.stride_tricks.as_strided
    for first, count in _runs(lw):
        pw = lw.pages[first]
        for w in "kv":
            nc = pw.stats_nbytes[w] // 4
            if nc == 0:
                continue
            src0, dst0, s_step, d_step = _preview_steps(lw, first, count, w)
            bits = strided(raw16[src0 // 2:], (count, 2, nc), (s_step, 2 * nc, 2))
            dst = strided(raw[dst0:], (count, 2, nc), (d_step, nc, 1))
            dst[:, 0] = tab[0][bits[:, 0]]
            dst[:, 1] = tab[1][bits[:, 1]]


def _host_copy(data: memoryview) -> torch.Tensor:
    """A writable uint8 tensor copy of received bytes (they may be read-only)."""
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())


def _fill_windows(raw: np.ndarray, base: int, lw: LayerWire) -> None:
    """Write each windowed page's window (lynx_stream.window_tail) and residual frame (its
    codes less the window's rows: trim_residual) from the landed bytes: the kernels wrote the
    page's whole residual codes to scratch."""
    cfg, h, d = lw.config, lw.num_kv_heads, lw.head_dim
    for p, pw in enumerate(lw.pages):
        rows, start = pw.window
        if not rows:
            continue
        (oa, na), (orr, nr) = lw.frame(p, 0), lw.frame(p, 1)
        anchor = torch.from_numpy(raw[base + oa:base + oa + na])
        slay = stream_layout(cfg, h, d, lw.dtype, pw.span.num_tokens, pw.span.num_sink)
        whole = torch.empty(slay.residual_nbytes, dtype=torch.uint8)
        for s in slay.residual:
            at = base + _offset(lw, p, pw.sections[s.name])
            whole[s.offset:s.offset + s.nbytes] = torch.from_numpy(raw[at:at + s.nbytes])
        anchor[start:] = window_tail(anchor[:start], whole, slay, cfg, h, d, rows)
        if pw.sections["k_res"][0] == SCRATCH:  # (not on a page all window: sent whole)
            raw[base + orr:base + orr + nr] = trim_residual(whole, slay, cfg, h, d, rows).numpy()
