"""Page plans: where every page's sections live in the back-to-back anchor / residual buffers.

A plan is an int64 table with one row per page, read by every compiled kernel, so no kernel
re-derives the byte layout (codec/lynx_layout.py stays the one description of it). Offsets are
absolute byte offsets into the buffer the kernel is given: the whole layer's buffer
(``LynxCodec.encode``: every page's buffer back to back) or one page's buffer.

Row fields (the ``F_*`` constants are the column indices the kernels use):
    token0       first token of the layer this page restores (0 on page 0: the sinks)
    body0        first quantized token;  num_body = quantized tokens;  num_sink = sink tokens
    k_codes ... v_res   absolute byte offset of each section (0 when the section is absent)
    pads         up to NUM_PADS (start, length) byte ranges of alignment padding to zero
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch

from lynx_npu.codec.lynx_config import LynxConfig
from lynx_npu.codec.lynx_layout import (PageLayout, PageSpan, page_layout, page_sinks,
                                       page_spans)

SECTIONS = ("k_codes", "v_codes", "k_gamma", "v_gamma", "k_stats", "v_stats", "k_sink", "v_sink",
            "k_res", "v_res")
F_TOKEN0, F_BODY0, F_NUM_BODY, F_NUM_SINK = 0, 1, 2, 3
F_SECTION = 4                      # F_SECTION + SECTIONS.index(name)
F_PADS = F_SECTION + len(SECTIONS)  # (start, length) pairs; anchor pads, then residual pads
NUM_PADS = 8
NUM_FIELDS = F_PADS + 2 * NUM_PADS
# Column of each section for a kernel handling K (which=0) or V (which=1).
F_CODES, F_GAMMA, F_STATS, F_SINK, F_RES = (F_SECTION + 2 * i for i in (0, 1, 2, 3, 4))


@dataclass(frozen=True)
class Page:
    span: PageSpan
    layout: PageLayout
    anchor_offset: int    # byte offset of this page's anchor buffer in the layer's buffer
    residual_offset: int


@dataclass(frozen=True)
class LayerPlan:
    """The pages of one layer [num_kv_heads, num_tokens, head_dim] and their plan table."""

    config: LynxConfig
    num_kv_heads: int
    num_tokens: int
    head_dim: int
    dtype: torch.dtype
    pages: tuple[Page, ...]
    anchor_nbytes: int
    residual_nbytes: int
    table: torch.Tensor   # int64 [num_pages, NUM_FIELDS], CPU
    token_offset: int = 0  # layer token of the plan's token 0 (page plans count from the page)
    _on_device: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_pages(self) -> int:
        return self.table.shape[0]  # the rows (wire-layout plans carry no Page objects)

    @functools.cached_property
    def section_align(self) -> int:
        """The largest of 16, 8, 4, 2, 1 bytes dividing every section offset (kernels vectorize
        loads and stores of the sections by it)."""
        offsets = self.table[:, F_SECTION:F_PADS].reshape(-1).tolist()
        return math.gcd(16, *offsets)

    def on(self, device) -> torch.Tensor:
        """The plan table on ``device`` (cached per device)."""
        key = str(torch.device(device))
        if key not in self._on_device:
            self._on_device[key] = self.table.to(device)
        return self._on_device[key]


def _row(page: Page) -> list[int]:
    s, lay = page.span, page.layout
    row = [0] * NUM_FIELDS
    row[F_TOKEN0], row[F_BODY0] = s.token_start, s.body_start
    row[F_NUM_BODY], row[F_NUM_SINK] = s.num_tokens, s.num_sink
    for stream, base, secs in (("anchor", page.anchor_offset, lay.anchor),
                               ("residual", page.residual_offset, lay.residual)):
        for sec in secs:
            row[F_SECTION + SECTIONS.index(sec.name)] = base + sec.offset
    pads = []
    for base, secs, slots in ((page.anchor_offset, lay.anchor, NUM_PADS - 1),
                              (page.residual_offset, lay.residual, 1)):
        found = [(base + a.offset + a.nbytes, b.offset - a.offset - a.nbytes)
                 for a, b in zip(secs, secs[1:]) if b.offset > a.offset + a.nbytes]
        assert len(found) <= slots, found
        pads += found + [(0, 0)] * (slots - len(found))
    for i, (start, length) in enumerate(pads):
        row[F_PADS + 2 * i], row[F_PADS + 2 * i + 1] = start, length
    return row


def _check_alignment(page: Page, dtype: torch.dtype) -> None:
    es = torch.empty((), dtype=dtype).element_size()
    for name in ("k_gamma", "v_gamma", "k_sink", "v_sink"):
        off = page.anchor_offset + page.layout.section(name).offset if _has(page, name) else 0
        assert off % es == 0, (name, off, es)


def _has(page: Page, name: str) -> bool:
    return any(s.name == name for s in page.layout.anchor)


@functools.lru_cache(maxsize=1024)
def layer_plan(cfg: LynxConfig, num_kv_heads: int, num_tokens: int, head_dim: int,
               dtype: torch.dtype) -> LayerPlan:
    if num_kv_heads < 1 or num_tokens < 1 or head_dim < 1:
        raise ValueError(f"layer shape [{num_kv_heads=}, {num_tokens=}, {head_dim=}] must be "
                         "positive")
    pages, a_off, r_off = [], 0, 0
    for span in page_spans(cfg, num_tokens):
        lay = page_layout(cfg, num_kv_heads, head_dim, dtype, span.num_tokens, span.num_sink)
        page = Page(span, lay, a_off, r_off)
        _check_alignment(page, dtype)
        pages.append(page)
        a_off += lay.anchor_nbytes
        r_off += lay.residual_nbytes
    table = torch.tensor([_row(p) for p in pages], dtype=torch.int64)
    return LayerPlan(cfg, num_kv_heads, num_tokens, head_dim, dtype, tuple(pages), a_off, r_off,
                     table)


def page_plan(cfg: LynxConfig, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
              token_start: int, token_end: int) -> LayerPlan:
    """A one-page plan for a page buffer on its own (the transport's unit), offsets from 0."""
    if not 0 <= token_start < token_end:
        raise ValueError(f"page token range [{token_start=}, {token_end=}) must be non-empty")
    ns = page_sinks(cfg, token_start, token_end)
    n = token_end - token_start
    span = PageSpan(0, 0, n, ns, ns)  # token positions relative to the page
    if span.num_tokens > cfg.page_size:
        raise ValueError(f"page [{token_start}, {token_end}) holds {span.num_tokens} quantized "
                         f"tokens; page_size={cfg.page_size}")
    return _single(cfg, num_kv_heads, head_dim, dtype, span, token_start)


@functools.lru_cache(maxsize=1024)
def _single(cfg, num_kv_heads, head_dim, dtype, span, token_start) -> LayerPlan:
    lay = page_layout(cfg, num_kv_heads, head_dim, dtype, span.num_tokens, span.num_sink)
    page = Page(span, lay, 0, 0)
    _check_alignment(page, dtype)
    table = torch.tensor([_row(page)], dtype=torch.int64)
    return LayerPlan(cfg, num_kv_heads, span.token_end, head_dim, dtype, (page,),
                     lay.anchor_nbytes, lay.residual_nbytes, table, token_start)

