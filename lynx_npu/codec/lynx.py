"""The Lynx codecs: ``lynx`` (split anchor + residual), ``lynx-int4`` (anchor only) and
``lynx-int8`` (both halves as one stream). Byte layout: lynx_layout.py; math: lynx_ref.py;
scalar previews (``get_codec("lynx")``'s default): lynx_stream.py."""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from . import lynx_ref, lynx_stream
from .base import Codec, Encoded, EncodedPage, check_page, validate_kv
from .lynx_config import LynxConfig, make_config, plan_text
from .lynx_layout import (SCALAR_DTYPE, PageLayout, PageSpan, page_layout, page_sinks, page_spans,
                          residual_nbytes, stream_layout, window_nbytes, window_rows)
from .packing import pack_bits, packed_nbytes, unpack_bits
from .registry import register_codec


@dataclass(frozen=True)
class EncodedLynx(Encoded):
    config: LynxConfig
    anchor: torch.Tensor            # uint8, every page's anchor buffer back to back
    residual: torch.Tensor | None   # uint8, every page's residual buffer back to back

    def nbytes(self, stage: str = "full") -> int:
        self.check_stage(stage)
        n = self.anchor.numel()
        if stage == "full" and self.residual is not None:
            n += self.residual.numel()
        return n


def _pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """[n, L] signed codes -> [n, packed_nbytes(L, bits)] bytes, one packed stream per row."""
    n, length = values.shape
    if (length * bits) % 8 == 0:
        return pack_bits(values.reshape(-1), bits).view(n, -1)
    return torch.stack([pack_bits(row, bits) for row in values])


def _unpack_rows(data: torch.Tensor, bits: int, length: int) -> torch.Tensor:
    n = data.shape[0]
    if (length * bits) % 8 == 0:
        return unpack_bits(data.reshape(-1), bits, n * length, signed=True).view(n, length)
    return torch.stack([unpack_bits(row, bits, length, signed=True) for row in data])


def _put(buf: torch.Tensor, layout: PageLayout, name: str, data: torch.Tensor) -> None:
    s = layout.section(name)
    raw = data.contiguous().view(torch.uint8).reshape(buf.shape[0], -1)
    assert raw.shape[1] == s.nbytes, (name, raw.shape, s)
    buf[:, s.offset:s.offset + s.nbytes] = raw


def _get(buf: torch.Tensor, layout: PageLayout, name: str, dtype: torch.dtype) -> torch.Tensor:
    s = layout.section(name)
    return buf[:, s.offset:s.offset + s.nbytes].contiguous().view(dtype)


class LynxCodec(Codec):
    """Split-stream Lynx. Stages: "anchor" (sign + MSBs + scalars + sinks), "full" (8 bits)."""

    name = "lynx"
    stages = ("anchor", "full")

    def __init__(self, preset: str | None = None, **overrides):
        self.config = make_config(preset, **overrides)

    def params(self) -> dict:
        from dataclasses import asdict
        params = asdict(self.config)
        for name in ("layer_anchor_bits", "layer_v_chunk_size"):  # scalars on the wire
            params[name] = plan_text(getattr(self.config, name))
        return params

    def for_layer(self, layer: int, num_layers: int) -> "LynxCodec":
        """The codec of layer ``layer`` of ``num_layers``: its own split and V chunk size where
        the per-layer plan lists it (itself where the config has no plan)."""
        cfg = self.config.for_layer(layer, num_layers)
        if cfg is self.config:
            return self
        out = copy.copy(self)
        out.config = cfg
        return out

    def _require_one_layer(self) -> None:
        if self.config.per_layer:
            raise ValueError("this lynx codec differs by layer (a per-layer plan: "
                             "layer_anchor_bits, layer_v_chunk_size): encode and decode a "
                             "layer with codec.for_layer(layer, num_layers)")

    # -- whole layer -------------------------------------------------------------------------
    def encode(self, k: torch.Tensor, v: torch.Tensor) -> EncodedLynx:
        self._require_one_layer()
        validate_kv(k, v)
        anchors, residuals = [], []
        for pages, spans, rows in self._blocks(k.shape[1]):
            a, r = self._encode_stream(k, v, spans, rows)
            anchors.append(a.reshape(-1))
            residuals.append(r.reshape(-1))
        return self._wrap(tuple(k.shape), k.dtype, torch.cat(anchors), torch.cat(residuals))

    def _wrap(self, shape, dtype, anchor, residual) -> EncodedLynx:
        return EncodedLynx(shape, dtype, self.stages, self.config, anchor, residual)

    def decode(self, enc: EncodedLynx, stage: str = "full"):
        self._require_one_layer()
        enc.check_stage(stage)
        h, t, d = enc.shape
        ks, vs = [], []
        for lay, a, r in self._kernel_blocks(enc.anchor, enc.residual if stage == "full"
                                             else None, enc.shape, enc.dtype):
            kb, vb = self._decode_block(a, r, lay, h, d, enc.dtype)
            ks.append(kb)
            vs.append(vb)
        return torch.cat(ks, dim=1), torch.cat(vs, dim=1)

    # -- kernel layout <-> streams (differ with scalar_preview and recent_tokens) ------------
    def layer_to_stream(self, anchor, residual, shape, dtype):
        """A layer's kernel-layout buffers (lynx_npu.ops.compress) -> this codec's streams."""
        self._require_one_layer()
        if self.config == self.config.kernel:
            return anchor, residual
        h, t, d = shape
        a_out, r_out, a_off, r_off = [], [], 0, 0
        for n, spans, rows in self._blocks(t):
            lay = self._layout(h, d, dtype, spans[0])
            a = anchor[a_off:a_off + n * lay.anchor_nbytes].view(n, -1)
            r = residual[r_off:r_off + n * lay.residual_nbytes].view(n, -1)
            a_off += n * lay.anchor_nbytes
            r_off += n * lay.residual_nbytes
            a, r = self._to_stream(a, r, lay, self._stream_layout(h, d, dtype, spans[0]), rows,
                                   h, d)
            a_out.append(a.reshape(-1))
            r_out.append(r.reshape(-1))
        return torch.cat(a_out), torch.cat(r_out)

    def layer_from_stream(self, anchor, residual, shape, dtype):
        """This codec's streams (residual None: anchor stage) -> kernel-layout buffers; anchor
        stage pages with a recent-token window come with the residual that decodes them."""
        self._require_one_layer()
        blocks = list(self._kernel_blocks(anchor, residual, shape, dtype))
        a = torch.cat([a.reshape(-1) for _, a, _ in blocks])
        if residual is None and not any(r is not None for *_, r in blocks):
            return a, None
        # Pages without a window take residual code 0 (exactly the anchor stage), so that the
        # whole layer decodes through the full-stage path.
        return a, torch.cat([(r if r is not None else torch.zeros(
            a.shape[0], lay.residual_nbytes, dtype=torch.uint8, device=a.device)).reshape(-1)
            for lay, a, r in blocks])

    def _kernel_blocks(self, anchor, residual, shape, dtype):
        """Yield (kernel layout, anchor [n, bytes], residual [n, bytes] or None) per block of
        a layer's streams; an anchor-stage block with a window has its made-up residual."""
        h, t, d = shape
        a_off = r_off = 0
        for n, spans, rows in self._blocks(t):
            lay = self._layout(h, d, dtype, spans[0])
            slay = self._stream_layout(h, d, dtype, spans[0])
            a_size = slay.anchor_nbytes + window_nbytes(self.config, slay, h, d, rows)
            r_size = residual_nbytes(self.config, slay, h, d, rows)
            a = anchor[a_off:a_off + n * a_size].view(n, -1)
            r = residual[r_off:r_off + n * r_size].view(n, -1) if residual is not None else None
            a_off += n * a_size
            r_off += n * r_size
            if rows:
                r = torch.stack([lynx_stream.window_residual(
                    a[j], slay, self.config, h, d, rows, None if r is None else r[j])
                    for j in range(n)])
            if rows:
                a = a[:, :slay.anchor_nbytes]
            if slay is not lay:
                a, r = lynx_stream.from_stream(a, r, lay, slay, self.config.scalar_grid)
            yield lay, a, r

    def _to_stream(self, a, r, lay: PageLayout, slay: PageLayout, rows: int, h: int, d: int):
        """[n, kernel bytes] pages -> [n, stream bytes], the window appended to the anchors
        and its rows left out of the residuals."""
        if slay is not lay:
            a, r = lynx_stream.to_stream(a, r, lay, slay, self.config.scalar_grid)
        if rows:
            pages = range(a.shape[0])
            a = torch.cat([a, torch.stack([lynx_stream.window_tail(
                a[j], r[j], slay, self.config, h, d, rows) for j in pages])], dim=1)
            r = torch.stack([lynx_stream.trim_residual(r[j], slay, self.config, h, d, rows)
                             for j in pages])
        return a, r

    # -- pages (the transport's unit) ---------------------------------------------------------
    def encode_pages(self, k: torch.Tensor, v: torch.Tensor) -> list[EncodedPage]:
        self._require_one_layer()
        validate_kv(k, v)
        out = []
        for pages, spans, rows in self._blocks(k.shape[1]):
            a, r = self._encode_stream(k, v, spans, rows)
            out += [EncodedPage(s.index, s.token_start, s.token_end, a[j], r[j])
                    for j, s in enumerate(spans)]
        return out

    def decode_page(self, anchor, residual, token_start, token_end, *, num_kv_heads, head_dim,
                    dtype):
        self._require_one_layer()
        anchor, residual, lay = self.kernel_page(anchor, residual, token_start, token_end,
                                                 num_kv_heads=num_kv_heads, head_dim=head_dim,
                                                 dtype=dtype)
        return self._decode_block(anchor.view(1, -1), None if residual is None
                                  else residual.view(1, -1), lay, num_kv_heads, head_dim, dtype)

    def kernel_page(self, anchor, residual, token_start, token_end, *, num_kv_heads, head_dim,
                    dtype):
        """Check one received page's buffers and return them in the kernel layout (what
        lynx_npu.ops decompresses) with that layout; without the residual, scalar previews
        are expanded in place of the exact scalars, and a page with a recent-token window
        comes back with its whole residual (its window's rows put back; at the anchor stage,
        the residual that decodes it there)."""
        self._require_one_layer()
        self._check_page(token_start, token_end, num_kv_heads, head_dim, dtype)
        ns = page_sinks(self.config, token_start, token_end)
        span = PageSpan(-1, token_start, token_end, token_start + ns, ns)
        lay = self._layout(num_kv_heads, head_dim, dtype, span)
        slay = self._stream_layout(num_kv_heads, head_dim, dtype, span)
        if self.config.recent_tokens:
            _check_len("anchor", anchor, anchor.numel())
            rows = lynx_stream.window_of(anchor, slay, self.config, num_kv_heads, head_dim)
            if rows:
                if residual is not None:
                    _check_len("residual", residual, residual.numel())
                residual = lynx_stream.window_residual(anchor, slay, self.config, num_kv_heads,
                                                       head_dim, rows, residual)
            anchor = anchor[:slay.anchor_nbytes]
        _check_len("anchor", anchor, slay.anchor_nbytes)
        if residual is not None:
            _check_len("residual", residual, slay.residual_nbytes)
        if slay is not lay:
            a, r = lynx_stream.from_stream(anchor.view(1, -1), None if residual is None
                                           else residual.view(1, -1), lay, slay,
                                           self.config.scalar_grid)
            anchor, residual = a[0], None if r is None else r[0]
        return anchor, residual, lay

    # -- internals ----------------------------------------------------------------------------
    def _check_page(self, token_start, token_end, num_kv_heads, head_dim, dtype) -> None:
        """A received page's claimed geometry, checked before any layout is sized from it."""
        check_page(token_start, token_end, num_kv_heads, head_dim, dtype,
                   max_tokens=self.config.page_size + self.config.num_sink_tokens)

    def _blocks(self, num_tokens: int):
        """Group page spans into runs of equal shape (page 0, full pages, the ragged tail, the
        pages with recent rows): (pages, spans, recent rows of each)."""
        groups: list[tuple[list[PageSpan], int]] = []
        for s in page_spans(self.config, num_tokens):
            rows = window_rows(self.config, s.body_start, s.token_end, num_tokens)
            last = groups[-1][0][0] if groups else None
            if last is not None and s.num_sink == 0 and last.num_sink == 0 \
                    and last.num_tokens == s.num_tokens and groups[-1][1] == rows:
                groups[-1][0].append(s)
            else:
                groups.append(([s], rows))
        return [(len(g), g, rows) for g, rows in groups]

    def _layout(self, h: int, d: int, dtype, span: PageSpan) -> PageLayout:
        return page_layout(self.config, h, d, dtype, span.num_tokens, span.num_sink)

    def _stream_layout(self, h: int, d: int, dtype, span: PageSpan) -> PageLayout:
        return stream_layout(self.config, h, d, dtype, span.num_tokens, span.num_sink)

    def _encode_stream(self, k, v, spans: list[PageSpan], rows: int):
        a, r = self._encode_block(k, v, spans)
        h, _, d = k.shape
        lay = self._layout(h, d, k.dtype, spans[0])
        return self._to_stream(a, r, lay, self._stream_layout(h, d, k.dtype, spans[0]), rows,
                               h, d)

    def _encode_block(self, k, v, spans: list[PageSpan]):
        h, _, d = k.shape
        n, s0 = len(spans), spans[0]
        tp = s0.num_tokens
        lay = self._layout(h, d, k.dtype, s0)
        cfg = self.config
        anchor = torch.zeros(n, lay.anchor_nbytes, dtype=torch.uint8, device=k.device)
        residual = torch.zeros(n, lay.residual_nbytes, dtype=torch.uint8, device=k.device)
        for which, x in (("k", k), ("v", v)):
            if tp:
                body = x[:, s0.body_start:s0.body_start + n * tp].reshape(h, n, tp, d).transpose(0, 1)
                a, r, gamma, stats = lynx_ref.quantize(body, cfg, which)
                _put(anchor, lay, f"{which}_codes", _pack_rows(a.reshape(n, -1), cfg.bits(which)))
                _put(residual, lay, f"{which}_res", _pack_rows(r.reshape(n, -1), cfg.residual_bits(which)))
                _put(anchor, lay, f"{which}_gamma", gamma)
                _put(anchor, lay, f"{which}_stats", stats)
            if s0.num_sink:
                _put(anchor, lay, f"{which}_sink", x[:, :s0.num_sink].unsqueeze(0))
        return anchor, residual

    def _decode_block(self, anchor, residual, lay: PageLayout, h, d, dtype):
        n, tp, cfg = anchor.shape[0], lay.num_tokens, self.config
        out = []
        for which in "kv":
            parts = []
            if lay.num_sink:
                parts.append(_get(anchor, lay, f"{which}_sink", dtype).view(n, h, lay.num_sink, d))
            if tp:
                count = h * tp * d
                a = _unpack_rows(_get(anchor, lay, f"{which}_codes", torch.uint8),
                                 cfg.bits(which), count).view(n, h, tp, d)
                r = None
                if residual is not None:
                    r = _unpack_rows(_get(residual, lay, f"{which}_res", torch.uint8),
                                     cfg.residual_bits(which), count).view(n, h, tp, d)
                gamma = _get(anchor, lay, f"{which}_gamma", dtype).view(n, 2, h * d)
                stats = _get(anchor, lay, f"{which}_stats", SCALAR_DTYPE).view(n, 2, -1)
                parts.append(lynx_ref.dequantize(a, r, gamma, stats, cfg, which, dtype))
            x = torch.cat(parts, dim=2)                 # [n, H, tokens, D]
            out.append(x.transpose(0, 1).reshape(h, -1, d))
        return out[0], out[1]


def _check_len(name: str, buf: torch.Tensor, expected: int) -> None:
    if buf.dtype != torch.uint8 or buf.dim() != 1:
        raise ValueError(f"{name} page buffer must be a 1-D uint8 tensor, got {buf.dtype} "
                         f"of shape {tuple(buf.shape)}")
    if buf.numel() != expected:
        raise ValueError(f"{name} page buffer has {buf.numel()} bytes; the layout needs {expected}")


class LynxInt4Codec(LynxCodec):
    """The anchor alone: Lynx's hierarchical quantization at ~4 bits, one stream."""

    name = "lynx-int4"
    stages = ("anchor",)

    def __init__(self, preset: str | None = None, **overrides):
        super().__init__(preset, **overrides)
        _no_preview(self)

    def _wrap(self, shape, dtype, anchor, residual) -> EncodedLynx:
        return EncodedLynx(shape, dtype, self.stages, self.config, anchor, None)

    def encode_pages(self, k, v):
        return [EncodedPage(p.index, p.token_start, p.token_end, p.anchor, None)
                for p in super().encode_pages(k, v)]

    def decode_page(self, anchor, residual, token_start, token_end, **kw):
        return super().decode_page(anchor, None, token_start, token_end, **kw)


class LynxInt8Codec(LynxCodec):
    """Anchor and residual as one 8-bit stream: decoding waits for all of it."""

    name = "lynx-int8"
    stages = ("full",)

    def __init__(self, preset: str | None = None, **overrides):
        super().__init__(preset, **overrides)
        _no_preview(self)

    def encode_pages(self, k, v):
        return [EncodedPage(p.index, p.token_start, p.token_end,
                            torch.cat([p.anchor, p.residual]), None)
                for p in super().encode_pages(k, v)]

    def decode_page(self, anchor, residual, token_start, token_end, *, num_kv_heads, head_dim,
                    dtype):
        self._check_page(token_start, token_end, num_kv_heads, head_dim, dtype)
        ns = page_sinks(self.config, token_start, token_end)
        lay = page_layout(self.config, num_kv_heads, head_dim, dtype,
                          token_end - token_start - ns, ns)
        _check_len("lynx-int8", anchor, lay.anchor_nbytes + lay.residual_nbytes)
        return super().decode_page(anchor[:lay.anchor_nbytes], anchor[lay.anchor_nbytes:],
                                   token_start, token_end, num_kv_heads=num_kv_heads,
                                   head_dim=head_dim, dtype=dtype)


def _no_preview(codec: LynxCodec) -> None:
    for name in ("scalar_preview", "recent_tokens"):
        if getattr(codec.config, name):
            raise ValueError(f"{codec.name} sends one stream: {name}="
                             f"{getattr(codec.config, name)!r} needs the split codec 'lynx'")


RECENT_TOKENS = 32  # get_codec("lynx")'s window: the lever measured in docs/codec.md


def _split_codec(preset: str | None = None, **overrides) -> LynxCodec:
    """``get_codec("lynx")``: the split codec with scalar previews on (the paper preset keeps
    its literal anchor); ``LynxCodec()`` itself defaults to the kernel layout."""
    overrides.setdefault("scalar_preview", preset in (None, "default"))
    overrides.setdefault("recent_tokens", RECENT_TOKENS if preset in (None, "default") else 0)
    return LynxCodec(preset, **overrides)


register_codec("lynx", _split_codec)
register_codec("lynx-int4", LynxInt4Codec)
register_codec("lynx-int8", LynxInt8Codec)

__all__ = ["EncodedLynx", "LynxCodec", "LynxInt4Codec", "LynxInt8Codec", "LynxConfig",
           "packed_nbytes"]
