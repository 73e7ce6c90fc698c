"""Where every section of a Lynx page goes on the wire: exact sizes and the kernels' tables.

The kernels (ops/plan.py) write and read sections at the absolute byte offsets of a plan table,
so they can write a layer's *wire* frames directly, with no relayout pass: this module places
each section of each page in the frames a codec sends, and builds the tables that point there.

Frames per page, by codec (codec/lynx.py is the specification; the serde tests compare bytes):

* ``lynx``:      anchor frame = the stream layout's anchor (codes, gamma, one byte per chunk
                 scalar or the exact stats, sinks); residual frame = residual codes (then, on
                 the float16 scalar grid, the exact stats; on the byte grid the kernels' float16
                 stats go to scratch, and the anchor's bytes are made from them). A page with a
                 recent-token window: the window after the anchor, and the residual codes less
                 its rows (the kernels' whole codes go to scratch; LynxSerde fills both).
* ``lynx-int4``: the kernel layout's anchor alone (the residual codes go to scratch, unsent).
* ``lynx-int8``: one frame, the kernel layout's anchor followed by its residual.

A *layer buffer* holds a layer's frames: every page's first frame, then every page's second,
then scratch, each frame starting on a FRAME_ALIGN boundary. Gaps between the sections of a
frame are zero on the wire; the kernels zero up to NUM_PADS of them per page from the table,
and ``LayerWire.extra_pads`` lists the rest (small shapes only) for the caller to zero.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from lynx_npu.codec.lynx_config import LynxConfig
from lynx_npu.codec.lynx_layout import (PageSpan, page_layout, page_sinks, page_spans,
                                        residual_nbytes, rows_left_out, stream_layout,
                                        window_nbytes, window_rows, windowed_residual)

from .plan import (F_BODY0, F_NUM_BODY, F_NUM_SINK, F_PADS, F_SECTION, F_TOKEN0, NUM_FIELDS,
                   NUM_PADS, SECTIONS, LayerPlan)

FRAME_ALIGN = 32
VARIANTS = ("lynx", "lynx-int4", "lynx-int8")
SCRATCH = -1          # frame index of sections computed but never sent (lynx-int4's residual)


def _up(n: int, a: int = FRAME_ALIGN) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class PageWire:
    """One page's frames and where its sections go: name -> (frame, byte offset in it)."""

    span: PageSpan
    frames: tuple[int, ...]                       # frame sizes (1 or 2 frames)
    sections: dict                                # kernel section -> (frame, offset)
    previews: dict                                # "k"/"v" -> (frame, offset) with previews
    stats_nbytes: dict                            # "k"/"v" -> bytes of the exact stats
    scratch_nbytes: int                           # unsent bytes the kernels still write
    pads: tuple[tuple[int, int, int], ...]        # (frame, offset, length) of zero gaps
    window: tuple[int, int] = (0, 0)              # recent rows, their window's anchor offset


@functools.lru_cache(maxsize=4096)
def page_wire(variant: str, cfg: LynxConfig, num_kv_heads: int, head_dim: int,
              dtype: torch.dtype, span: PageSpan, rows: int = 0) -> PageWire:
    """``rows``: the page's recent rows (``recent_tokens``), whose window follows the anchor
    frame's sections and whose residual codes the residual frame leaves out (payload format
    9); the kernels write neither: they write the page's whole residual to scratch, and
    LynxSerde fills the window and the residual frame from it once staged."""
    if variant not in VARIANTS:
        raise ValueError(f"{variant=} must be one of {VARIANTS}")
    kl = page_layout(cfg, num_kv_heads, head_dim, dtype, span.num_tokens, span.num_sink)
    sections, previews, scratch, window = {}, {}, 0, (0, 0)
    filled = []  # frame bytes LynxSerde writes once the kernels' have landed (windows)
    if variant == "lynx":
        sl = stream_layout(cfg, num_kv_heads, head_dim, dtype, span.num_tokens, span.num_sink)
        extra = window_nbytes(cfg, sl, num_kv_heads, head_dim, rows)
        frames = (sl.anchor_nbytes + extra,
                  residual_nbytes(cfg, sl, num_kv_heads, head_dim, rows))
        window = (rows, sl.anchor_nbytes) if rows else window
        sent = windowed_residual(cfg, sl, num_kv_heads, head_dim, rows)[0] if rows \
            else sl.residual
        for fi, secs in ((0, sl.anchor), (1, sent)):
            for s in secs:
                if s.name.endswith("_preview"):
                    previews[s.name[0]] = (fi, s.offset)
                elif rows_left_out(sl, rows) and s.name.endswith("_res"):  # the window's rows left out: the
                    filled.append((fi, s.offset, s.nbytes))  # kernels write the whole to scratch
                else:
                    sections[s.name] = (fi, s.offset)
        if window[0]:
            filled.append((0, window[1], frames[0] - window[1]))
        for s in kl.anchor + kl.residual:  # byte grid: the anchor's bytes are the scalars, sent
            if s.name not in sections:      # once; the kernels' float16 copy goes to scratch
                sections[s.name] = (SCRATCH, scratch)
                scratch = _up(scratch + s.nbytes)
    elif variant == "lynx-int4":
        frames = (kl.anchor_nbytes,)
        sections = {s.name: (0, s.offset) for s in kl.anchor}
        sections.update({s.name: (SCRATCH, s.offset) for s in kl.residual})
        scratch = kl.residual_nbytes
    else:
        frames = (kl.anchor_nbytes + kl.residual_nbytes,)
        sections = {s.name: (0, s.offset) for s in kl.anchor}
        sections.update({s.name: (0, kl.anchor_nbytes + s.offset) for s in kl.residual})
    sizes = {s.name: s.nbytes for s in kl.anchor + kl.residual}
    written = [(f, o, sizes[n]) for n, (f, o) in sections.items() if f != SCRATCH]
    written += [(f, o, sizes[w + "_stats"] // 2) for w, (f, o) in previews.items()] + filled
    pads = []
    for fi, size in enumerate(frames):
        end = 0
        for f, o, n in sorted(x for x in written if x[0] == fi):
            if o > end:
                pads.append((fi, end, o - end))
            end = max(end, o + n)
        assert end == size, (variant, fi, end, size)
    return PageWire(span, frames, sections, previews,
                    {w: sizes[w + "_stats"] for w in "kv"}, scratch, tuple(pads), window)


@dataclass(frozen=True)
class LayerWire:
    """A layer's pages in one layer buffer: frame offsets, sizes and the compress table."""

    variant: str
    config: LynxConfig
    num_kv_heads: int
    num_tokens: int
    head_dim: int
    dtype: torch.dtype
    pages: tuple[PageWire, ...]
    frame_offsets: tuple[tuple[int, ...], ...]    # [page][frame] byte offset in the buffer
    scratch_offsets: tuple[int, ...]
    nbytes: int                                   # the layer buffer (a multiple of 16)
    wire_nbytes: int                              # the bytes sent (frames only)
    plan: LayerPlan                               # the compress table over the buffer
    preview_offsets: torch.Tensor | None          # int64 [num_pages, 2] (k, v) or None
    extra_pads: tuple[tuple[int, int], ...]       # (offset, length) the kernels do not zero
    _on_device: dict = field(default_factory=dict, compare=False, repr=False)

    def previews_on(self, device) -> torch.Tensor:
        """The preview offsets on ``device`` (cached per device)."""
        key = str(torch.device(device))
        if key not in self._on_device:
            self._on_device[key] = self.preview_offsets.to(device)
        return self._on_device[key]

    def frame(self, page: int, frame: int) -> tuple[int, int]:
        """(offset, nbytes) of one frame in the layer buffer."""
        return self.frame_offsets[page][frame], self.pages[page].frames[frame]


def _abs(pw: PageWire, frame_base: tuple[int, ...], scratch_base: int, where) -> int:
    f, o = where
    return (scratch_base if f == SCRATCH else frame_base[f]) + o


@functools.lru_cache(maxsize=256)
def layer_wire(variant: str, cfg: LynxConfig, num_kv_heads: int, num_tokens: int,
               head_dim: int, dtype: torch.dtype) -> LayerWire:
    if num_kv_heads < 1 or num_tokens < 1 or head_dim < 1:
        raise ValueError(f"layer shape [{num_kv_heads=}, {num_tokens=}, {head_dim=}] must be "
                         "positive")
    pages = tuple(page_wire(variant, cfg, num_kv_heads, head_dim, dtype, s,
                            window_rows(cfg, s.body_start, s.token_end, num_tokens)
                            if variant == "lynx" else 0)
                  for s in page_spans(cfg, num_tokens))
    nframes = len(pages[0].frames)
    bases, off = [[0] * nframes for _ in pages], 0
    for fi in range(nframes):
        for p, pw in enumerate(pages):
            bases[p][fi] = off
            off = _up(off + pw.frames[fi])
    wire_nbytes = sum(sum(pw.frames) for pw in pages)
    scratch = []
    for pw in pages:
        scratch.append(off)
        off = _up(off + pw.scratch_nbytes)
    rows, extra, prev = [], [], []
    for p, pw in enumerate(pages):
        row = [0] * NUM_FIELDS
        s = pw.span
        row[F_TOKEN0], row[F_BODY0] = s.token_start, s.body_start
        row[F_NUM_BODY], row[F_NUM_SINK] = s.num_tokens, s.num_sink
        for name, where in pw.sections.items():
            row[F_SECTION + SECTIONS.index(name)] = _abs(pw, bases[p], scratch[p], where)
        pads = [(bases[p][f] + o, n) for f, o, n in pw.pads]
        for i, (start, length) in enumerate(pads[:NUM_PADS]):
            row[F_PADS + 2 * i], row[F_PADS + 2 * i + 1] = start, length
        extra += pads[NUM_PADS:]
        rows.append(row)
        prev.append([_abs(pw, bases[p], 0, pw.previews[w]) if w in pw.previews else 0
                     for w in "kv"])
    table = torch.tensor(rows, dtype=torch.int64)
    plan = LayerPlan(cfg.kernel, num_kv_heads, num_tokens, head_dim,
                     dtype, (), _up(off, 16), _up(off, 16), table)
    previews = torch.tensor(prev, dtype=torch.int64) if pages[0].previews else None
    return LayerWire(variant, cfg, num_kv_heads, num_tokens, head_dim, dtype, pages,
                     tuple(tuple(b) for b in bases), tuple(scratch), _up(off, 16),
                     wire_nbytes, plan, previews, tuple(extra))


def received_span(cfg: LynxConfig, token_start: int, token_end: int) -> PageSpan:
    """The span of a received page (its index is not needed to place its sections)."""
    ns = page_sinks(cfg, token_start, token_end)
    return PageSpan(-1, token_start, token_end, token_start + ns, ns)
