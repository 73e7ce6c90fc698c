"""Byte layout of Lynx pages (registry.PAYLOAD_FORMAT): described once, as
data, for every backend.

A layer of ``T`` tokens is cut into pages of the *body* (the tokens after the
``num_sink_tokens`` exact sinks): page ``i`` quantizes body tokens ``[i*P, min((i+1)*P, Tb))``;
page 0 also carries the sinks, so its token span starts at 0. Each page has one contiguous
anchor buffer and one contiguous residual buffer, made of sections that each start at a
multiple of ``ALIGN`` bytes (zero padding in between; Ascend DMA wants 32-byte alignment):

anchor:   k_codes, v_codes   anchor codes of [H, Tp, D] in row-major order, packed (packing.py)
          k_gamma, v_gamma   [2, H*D] in the KV dtype: per-channel page min, then page max
          k_stats, v_stats   [2, num_chunks] float16: chunk mean mu, then chunk scale sigma
          k_sink, v_sink     [H, num_sink, D] in the KV dtype, page 0 only
residual: k_res, v_res       residual codes of [H, Tp, D], packed

That is the *kernel* layout (``page_layout``), which every backend of lynx_npu.ops reads and
writes. With ``scalar_preview`` the streams carry the page differently (``stream_layout``):
the anchor's k_stats / v_stats become k_preview / v_preview ([2, num_chunks] uint8, one byte per
scalar; lynx_stream.py). On the byte scalar grid (``scalar_grid="byte"``) those bytes are the
scalars themselves, sent once; on the float16 grid they are previews and the exact k_stats /
v_stats follow the residual codes. A page with a recent-token window (``window_layout``)
carries its last rows' residual codes after its anchor, and its residual stream leaves those
rows out (``windowed_residual``).

Chunk order: axis "channel" (C tokens of one channel) -> [H, ceil(Tp/C), D];
axis "token" (C head_dim values of one token) -> [H, Tp, ceil(D/C)]. The last chunk of a
ragged page or head_dim is short; no padding values enter any statistic.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .lynx_config import LynxConfig
from .packing import packed_nbytes

ALIGN = 32
SCALAR_DTYPE = torch.float16  # mu and sigma live in the page-normalised domain [0, 1]


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def num_chunks(axis: str, num_heads: int, num_tokens: int, head_dim: int, chunk: int) -> int:
    if axis == "channel":
        return num_heads * -(-num_tokens // chunk) * head_dim
    return num_heads * num_tokens * -(-head_dim // chunk)


@dataclass(frozen=True)
class Section:
    name: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class PageLayout:
    num_tokens: int   # body tokens quantized in this page (Tp)
    num_sink: int     # exact sink tokens carried (page 0 only)
    anchor: tuple[Section, ...]
    residual: tuple[Section, ...]
    anchor_nbytes: int
    residual_nbytes: int

    def section(self, name: str) -> Section:
        for s in self.anchor + self.residual:
            if s.name == name:
                return s
        raise KeyError(name)


def _sections(sizes: list[tuple[str, int]]) -> tuple[tuple[Section, ...], int]:
    out, off = [], 0
    for name, n in sizes:
        out.append(Section(name, off, n))
        off = _align(off + n)
    end = out[-1].offset + out[-1].nbytes if out else 0
    return tuple(out), end


@functools.lru_cache(maxsize=4096)
def page_layout(cfg: LynxConfig, num_heads: int, head_dim: int, dtype: torch.dtype,
                num_tokens: int, num_sink: int) -> PageLayout:
    """The kernel layout of one page (the same whatever the stream formats)."""
    if cfg != cfg.kernel:
        return page_layout(cfg.kernel, num_heads, head_dim, dtype, num_tokens, num_sink)
    n = num_heads * num_tokens * head_dim
    es = _itemsize(dtype)
    gamma = 2 * num_heads * head_dim * es if num_tokens else 0
    anchor = [("k_codes", packed_nbytes(n, cfg.bits("k"))),
              ("v_codes", packed_nbytes(n, cfg.bits("v"))),
              ("k_gamma", gamma), ("v_gamma", gamma)]
    for which in "kv":
        nc = num_chunks(cfg.axis(which), num_heads, num_tokens, head_dim, cfg.chunk(which))
        anchor.append((f"{which}_stats", 2 * nc * _itemsize(SCALAR_DTYPE)))
    if num_sink:
        sink = num_heads * num_sink * head_dim * es
        anchor += [("k_sink", sink), ("v_sink", sink)]
    residual = [("k_res", packed_nbytes(n, cfg.residual_bits("k"))),
                ("v_res", packed_nbytes(n, cfg.residual_bits("v")))]
    a, a_n = _sections(anchor)
    r, r_n = _sections(residual)
    return PageLayout(num_tokens, num_sink, a, r, a_n, r_n)


def stats_in_residual(cfg: LynxConfig) -> bool:
    """Whether the residual stream carries the exact chunk scalars after one-byte previews in
    the anchor (float16 grid), rather than the anchor carrying them once (byte grid)."""
    return cfg.scalar_preview and cfg.scalar_grid == "float16"


@functools.lru_cache(maxsize=4096)
def stream_layout(cfg: LynxConfig, num_heads: int, head_dim: int, dtype: torch.dtype,
                  num_tokens: int, num_sink: int) -> PageLayout:
    """One page as the anchor and residual streams carry it: the kernel layout, or with
    ``scalar_preview`` one byte per chunk scalar in the anchor (and on the float16 grid the
    exact scalars in the residual); sections in the same order otherwise, so only the stats
    move."""
    kernel = page_layout(cfg, num_heads, head_dim, dtype, num_tokens, num_sink)
    if not cfg.scalar_preview:
        return kernel
    if cfg.recent_tokens:
        return stream_layout(cfg.replace(recent_tokens=0), num_heads, head_dim, dtype,
                             num_tokens, num_sink)
    anchor, residual = [], [(s.name, s.nbytes) for s in kernel.residual]
    for s in kernel.anchor:
        if s.name.endswith("_stats"):
            anchor.append((s.name[0] + "_preview", s.nbytes // _itemsize(SCALAR_DTYPE)))
            if stats_in_residual(cfg):
                residual.append((s.name, s.nbytes))
        else:
            anchor.append((s.name, s.nbytes))
    a, a_n = _sections(anchor)
    r, r_n = _sections(residual)
    return PageLayout(num_tokens, num_sink, a, r, a_n, r_n)


@dataclass(frozen=True)
class PageSpan:
    index: int
    token_start: int  # first token of the layer this page restores (0 for page 0: the sinks)
    token_end: int
    body_start: int   # first quantized token
    num_sink: int

    @property
    def num_tokens(self) -> int:
        return self.token_end - self.body_start


def page_sinks(cfg: LynxConfig, token_start: int, token_end: int) -> int:
    """Exact sink tokens of the page [token_start, token_end): the layer's first
    num_sink_tokens, so only the page that starts at token 0 holds any."""
    return min(cfg.num_sink_tokens, token_end) if token_start == 0 else 0


def page_spans(cfg: LynxConfig, num_tokens: int) -> list[PageSpan]:
    ns = min(cfg.num_sink_tokens, num_tokens)
    spans, start, i = [], ns, 0
    while True:
        end = min(start + cfg.page_size, num_tokens)
        spans.append(PageSpan(i, 0 if i == 0 else start, end, start, ns if i == 0 else 0))
        if end >= num_tokens:
            return spans
        start, i = end, i + 1


# -- the recent-token window (``recent_tokens``; lynx_stream.py fills and reads it) ---------------

RECENT_SHARE = 64  # a window is sent only where it is at most 1/64 of the layer's tokens


def recent_window(cfg: LynxConfig, num_tokens: int) -> int:
    """How many of a layer's last tokens its window holds: ``recent_tokens`` where that is at
    most 1/RECENT_SHARE of the layer, else none. The window costs ~5.5 bits per value (residual
    codes and exact scalars), so it adds at most ~0.09 bits per value to the anchor, which
    stays within 4.75 (measured on 40 MMLU-Pro prompts of 896-2460 tokens: a window capped at a
    64th of shorter layers cost up to 4.81 bits there, and moved no prompt for the better)."""
    w = cfg.recent_tokens
    return w if w * RECENT_SHARE <= num_tokens else 0


def window_rows(cfg: LynxConfig, body_start: int, token_end: int, num_tokens: int) -> int:
    """Body rows of the page [body_start, token_end) of a ``num_tokens`` layer that lie in its
    window (``recent_window``): the last rows of the page, or none."""
    w = recent_window(cfg, num_tokens)
    return max(0, token_end - max(body_start, num_tokens - w)) if w else 0


def window_chunks(cfg: LynxConfig, which: str, num_heads: int, num_tokens: int, head_dim: int,
                  rows: int) -> int:
    """Chunk scalars (per mu or sigma) of the chunks that hold a page's last ``rows`` rows."""
    if cfg.axis(which) == "channel":
        first = (num_tokens - rows) // cfg.chunk(which)
        return num_heads * (-(-num_tokens // cfg.chunk(which)) - first) * head_dim
    return num_heads * rows * -(-head_dim // cfg.chunk(which))


@functools.lru_cache(maxsize=4096)
def window_layout(cfg: LynxConfig, num_heads: int, head_dim: int, num_tokens: int,
                  rows: int) -> tuple[tuple[Section, ...], int]:
    """The window that follows a page's stream anchor (at the next ALIGN boundary) when the page
    holds ``rows`` > 0 recent rows: ``window`` (uint32 ``rows``, so a page says what it
    carries), ``k_wres`` / ``v_wres`` (the rows' residual codes, [H, rows, D] packed) and, with
    previews of float16 scalars (``stats_in_residual``), ``k_wstats`` / ``v_wstats`` (float16
    [2, n]: the exact mu, then sigma, of the chunks holding the rows, in the stats' order).
    -> (sections, bytes)."""
    n = num_heads * rows * head_dim
    sizes = [("window", 4), ("k_wres", packed_nbytes(n, cfg.residual_bits("k"))),
             ("v_wres", packed_nbytes(n, cfg.residual_bits("v")))]
    if stats_in_residual(cfg):
        for which in "kv":
            nc = window_chunks(cfg, which, num_heads, num_tokens, head_dim, rows)
            sizes.append((f"{which}_wstats", 2 * nc * _itemsize(SCALAR_DTYPE)))
    return _sections(sizes)


def rows_left_out(stream: PageLayout, rows: int) -> int:
    """The window rows a page's residual stream leaves out (payload format 9): all of them,
    unless they are the whole page, whose residual stream is then sent whole (a data frame
    carries at least one byte; the page holds at most ``recent_tokens`` rows)."""
    return rows if rows < stream.num_tokens else 0


@functools.lru_cache(maxsize=4096)
def windowed_residual(cfg: LynxConfig, stream: PageLayout, num_heads: int, head_dim: int,
                      rows: int) -> tuple[tuple[Section, ...], int]:
    """The residual stream of a page whose window carries its last ``rows`` rows (payload
    format 9): the stream layout's sections, with ``k_res`` / ``v_res`` holding only rows
    [0, Tp - rows) of every head ([H, Tp - rows, D] packed): the window sends the rest once
    (``rows_left_out``). -> (sections, bytes)."""
    if not rows_left_out(stream, rows):
        return stream.residual, stream.residual_nbytes
    n = num_heads * (stream.num_tokens - rows) * head_dim
    return _sections([(s.name, packed_nbytes(n, cfg.residual_bits(s.name[0]))
                       if s.name.endswith("_res") else s.nbytes) for s in stream.residual])


def residual_nbytes(cfg: LynxConfig, stream: PageLayout, num_heads: int, head_dim: int,
                    rows: int) -> int:
    """Bytes of a page's residual stream: the stream layout's, less its window's rows."""
    return windowed_residual(cfg, stream, num_heads, head_dim, rows)[1]


def window_start(stream: PageLayout) -> int:
    """Where a page's window begins in its anchor buffer."""
    return _align(stream.anchor_nbytes)


def window_nbytes(cfg: LynxConfig, stream: PageLayout, num_heads: int, head_dim: int,
                  rows: int) -> int:
    """Bytes a window of ``rows`` adds to a page's anchor buffer (its padding included)."""
    if not rows:
        return 0
    return window_start(stream) - stream.anchor_nbytes + window_layout(
        cfg, num_heads, head_dim, stream.num_tokens, rows)[1]
