"""Scalar previews: the chunk scalars' most significant byte goes first (``scalar_preview``).

The chunk scalars mu and sigma are float16, two per chunk: at C = 32 that is one bit per
value, a fifth of the anchor on the wire (5.1 bits/value against INT4's 4.5). Lynx's own idea
applies to them: with ``scalar_preview`` the anchor carries one byte per scalar and the
residual their exact float16 values, so the anchor shrinks to ~4.6 bits/value and the residual
grows by one. Codes are always computed against the exact scalars, so the full stage is bit
for bit the one without previews (and lynx-int8's); only the anchor-stage reconstruction, the
cache the drafts are computed on, sees the previews.

  mu in [0, 1] (page-normalised, either centre): linear, u = round(255 mu); error <= 1/510.
  sigma in [0, 1], used relative to itself: u = 0 for 0, else the nearest of 255 geometric
  levels 2^-14 .. 1 in log2 (ratio 2^(14/254)); relative error <= 2.0% above 2^-14.

On the byte scalar grid (``scalar_grid="byte"``, lynx_tables.py) the quantizer's scalars are
already one of 256 values each: the anchor's bytes are then the scalars themselves (the index
of each on the grid), sent once, and neither the residual nor a window repeats them. The same
functions serve both grids (``grid``); only the tables differ.

The recent-token window (``recent_tokens``): the page(s) holding a layer's last W tokens carry,
after their anchor, those rows' residual codes and (with previews) their chunks' exact scalars
(lynx_layout.window_layout); their residual stream then leaves those rows out (payload format
9: ``trim_residual``), so each code is sent once. Both stages of such a page decode through
the full-stage path on the whole residual made up here (``window_residual``): the residual
stream's rows, or at the anchor stage zero (residual code 0 is exactly the anchor stage,
I' = m << r) with the expanded previews, then the window's. So no backend changes.

Previews are made once by the encoder (this torch code, for every backend: they cost a pass
over 1/32 of the values) and expanded by a 256-entry table lookup. ``to_stream`` and
``from_stream`` move whole pages between the kernel layout (lynx_npu.ops) and the streams.
"""
from __future__ import annotations

import functools

import torch

from . import lynx_tables
from .lynx_config import LynxConfig
from .lynx_layout import (SCALAR_DTYPE, PageLayout, stats_in_residual, window_layout,
                          rows_left_out, window_start, windowed_residual)
from .packing import pack_bits, packed_nbytes, unpack_bits

SIGMA_MIN_LOG2 = -14.0
_SIGMA_STEPS = 254  # geometric steps between levels 1 and 255


@functools.lru_cache(maxsize=None)
def preview_levels(grid: str = "float16") -> torch.Tensor:
    """float32 [2, 256]: the value each byte stands for (row 0 mu, row 1 sigma): a preview of
    a float16 scalar, or on the byte grid the scalar itself."""
    u = torch.arange(256, dtype=torch.float64)
    if grid == "byte":
        return torch.stack([(u / lynx_tables.MU_STEPS).float(), lynx_tables.sigma_levels()])
    mu = u / 255
    sigma = torch.exp2(SIGMA_MIN_LOG2 + (u - 1) * (-SIGMA_MIN_LOG2 / _SIGMA_STEPS))
    sigma[0] = 0
    return torch.stack([mu, sigma]).to(SCALAR_DTYPE).float()


def preview(stats: torch.Tensor, grid: str = "float16") -> torch.Tensor:
    """[..., 2, nc] float16 (mu, sigma) -> [..., 2, nc] uint8 bytes: previews, or on the byte
    grid the scalars' own indices (exact for scalars on the grid, as the quantizer makes them)."""
    s = stats.float()
    mu, sigma = s[..., 0, :], s[..., 1, :]
    if grid == "byte":
        u_mu = torch.round(mu.clamp(0, 1) * lynx_tables.MU_STEPS).clamp(max=255)
        u_sigma = lynx_tables.sigma_index(sigma)
        return torch.stack([u_mu.to(torch.int64), u_sigma], dim=-2).to(torch.uint8)
    u_mu = torch.round(mu.clamp(0, 1) * 255)
    steps = (torch.log2(sigma.clamp_min(2.0 ** SIGMA_MIN_LOG2)) - SIGMA_MIN_LOG2) \
        * (_SIGMA_STEPS / -SIGMA_MIN_LOG2)
    u_sigma = torch.where(sigma > 0, 1 + torch.round(steps).clamp(0, _SIGMA_STEPS), 0)
    return torch.stack([u_mu, u_sigma], dim=-2).to(torch.uint8)


def expand(previews: torch.Tensor, grid: str = "float16") -> torch.Tensor:
    """[..., 2, nc] uint8 -> [..., 2, nc] float16 (mu, sigma): stand-ins, or on the byte grid
    the scalars themselves."""
    lv = preview_levels(grid).to(previews.device)
    idx = previews.long()
    return torch.stack([lv[0][idx[..., 0, :]], lv[1][idx[..., 1, :]]], dim=-2).to(SCALAR_DTYPE)


def _view(buf: torch.Tensor, lay: PageLayout, name: str) -> torch.Tensor:
    s = lay.section(name)
    return buf[:, s.offset:s.offset + s.nbytes]


def to_stream(anchor: torch.Tensor, residual: torch.Tensor, kernel: PageLayout,
              stream: PageLayout, grid: str = "float16") -> tuple[torch.Tensor, torch.Tensor]:
    """[n, kernel bytes] anchor / residual pages -> [n, stream bytes] (one byte per scalar in
    the anchor; on the float16 grid the exact scalars after the residual codes)."""
    n = anchor.shape[0]
    a = torch.zeros(n, stream.anchor_nbytes, dtype=torch.uint8, device=anchor.device)
    r = torch.zeros(n, stream.residual_nbytes, dtype=torch.uint8, device=anchor.device)
    for s in stream.anchor:
        if s.name.endswith("_preview"):
            stats = _view(anchor, kernel, s.name[0] + "_stats").contiguous().view(SCALAR_DTYPE)
            a[:, s.offset:s.offset + s.nbytes] = preview(stats.view(n, 2, -1),
                                                         grid).view(n, -1)
        else:
            a[:, s.offset:s.offset + s.nbytes] = _view(anchor, kernel, s.name)
    for s in stream.residual:
        src = residual if s.name.endswith("_res") else anchor
        r[:, s.offset:s.offset + s.nbytes] = _view(src, kernel, s.name)
    return a, r


def from_stream(anchor: torch.Tensor, residual: torch.Tensor | None, kernel: PageLayout,
                stream: PageLayout, grid: str = "float16") -> tuple[torch.Tensor,
                                                                    torch.Tensor | None]:
    """Stream pages -> kernel-layout pages: the scalars expanded from the anchor's bytes, or
    the exact ones from the residual where it carries them (float16 grid; without it, the
    anchor stage, the previews stand in for them)."""
    n = anchor.shape[0]
    a = torch.zeros(n, kernel.anchor_nbytes, dtype=torch.uint8, device=anchor.device)
    names = {s.name for s in stream.residual}
    for s in kernel.anchor:
        dst = a[:, s.offset:s.offset + s.nbytes]
        if not s.name.endswith("_stats"):
            dst.copy_(_view(anchor, stream, s.name))
        elif residual is not None and s.name in names:
            dst.copy_(_view(residual, stream, s.name))
        else:
            u = _view(anchor, stream, s.name[0] + "_preview").reshape(n, 2, -1)
            dst.copy_(expand(u, grid).view(torch.uint8).view(n, -1))
    if residual is None:
        return a, None
    r = torch.zeros(n, kernel.residual_nbytes, dtype=torch.uint8, device=anchor.device)
    for s in kernel.residual:
        r[:, s.offset:s.offset + s.nbytes] = _view(residual, stream, s.name)
    return a, r


# -- the recent-token window ---------------------------------------------------------------------

def _rows(codes: torch.Tensor, bits: int, h: int, tp: int, d: int) -> torch.Tensor:
    """One page's packed [H, Tp, D] codes -> [H, Tp, D] int64 (signed)."""
    return unpack_bits(codes, bits, h * tp * d, signed=True).view(h, tp, d)


def _window_stats(stats: torch.Tensor, cfg: LynxConfig, which: str, h: int, tp: int, d: int,
                  rows: int) -> torch.Tensor:
    """[2, nc] stats of a page -> a view of the chunks holding its last ``rows`` rows."""
    if cfg.axis(which) == "channel":
        per = stats.view(2, h, -1, d)
        return per[:, :, (tp - rows) // cfg.chunk(which):, :]
    return stats.view(2, h, tp, -1)[:, :, tp - rows:, :]


def _section(buf: torch.Tensor, lay: PageLayout | tuple, name: str) -> torch.Tensor:
    """A section of one page buffer; ``lay`` a layout or its sections (windowed_residual)."""
    s = lay.section(name) if isinstance(lay, PageLayout) else next(x for x in lay
                                                                   if x.name == name)
    return buf[s.offset:s.offset + s.nbytes]


def _row_bytes(bits: int, d: int) -> int:
    """Bytes of one packed row of ``d`` codes, or 0 where rows do not end on a byte."""
    return d * bits // 8 if d * bits % 8 == 0 else 0


def _rows_packed(codes: torch.Tensor, bits: int, h: int, tp: int, d: int, lo: int,
                 hi: int) -> torch.Tensor:
    """Rows [lo, hi) of every head of one page's packed [H, Tp, D] codes, packed."""
    rb = _row_bytes(bits, d)
    if rb:  # whole bytes per row (every head_dim of 8 or more): slice them
        return codes[:h * tp * rb].view(h, tp, rb)[:, lo:hi].reshape(-1)
    return pack_bits(_rows(codes, bits, h, tp, d)[:, lo:hi].reshape(-1), bits)


def _cat_rows(first: torch.Tensor, n1: int, second: torch.Tensor, n2: int, bits: int, h: int,
              d: int) -> torch.Tensor:
    """Packed [H, n1, D] and [H, n2, D] codes -> packed [H, n1 + n2, D] (each head's rows of
    ``first``, then of ``second``)."""
    rb = _row_bytes(bits, d)
    if rb:
        return torch.cat([first.view(h, n1, rb), second.view(h, n2, rb)], dim=1).reshape(-1)
    return pack_bits(torch.cat([_rows(first, bits, h, n1, d), _rows(second, bits, h, n2, d)],
                               dim=1).reshape(-1), bits)


def window_tail(anchor: torch.Tensor, residual: torch.Tensor, stream: PageLayout,
                cfg: LynxConfig, h: int, d: int, rows: int) -> torch.Tensor:
    """A page's window (``rows`` > 0) from its stream buffers (1-D uint8; the residual whole,
    as the stream layout has it) -> the bytes that follow its anchor (from ``window_start``:
    zero padding first)."""
    tp = stream.num_tokens
    sections, end = window_layout(cfg, h, d, tp, rows)
    pad = window_start(stream) - stream.anchor_nbytes
    out = torch.zeros(pad + end, dtype=torch.uint8, device=anchor.device)
    tail = out[pad:]
    for s in sections:
        dst = tail[s.offset:s.offset + s.nbytes]
        if s.name == "window":
            dst.copy_(torch.tensor(list(rows.to_bytes(4, "little")), dtype=torch.uint8))
        elif s.name.endswith("_wres"):
            dst.copy_(_rows_packed(_section(residual, stream, s.name[0] + "_res"),
                                   cfg.residual_bits(s.name[0]), h, tp, d, tp - rows, tp))
        else:
            stats = _section(residual, stream, s.name[0] + "_stats").view(SCALAR_DTYPE)
            dst.copy_(_window_stats(stats, cfg, s.name[0], h, tp, d, rows)
                      .contiguous().view(torch.uint8).reshape(-1))
    return out


def trim_residual(residual: torch.Tensor, stream: PageLayout, cfg: LynxConfig, h: int, d: int,
                  rows: int) -> torch.Tensor:
    """A windowed page's whole residual (1-D, the stream layout's) -> what its residual
    stream sends (lynx_layout.windowed_residual): every head's window rows dropped, since the
    window in the anchor carries them."""
    if not rows_left_out(stream, rows):
        return residual
    tp = stream.num_tokens
    sections, end = windowed_residual(cfg, stream, h, d, rows)
    out = torch.zeros(end, dtype=torch.uint8, device=residual.device)
    for s in sections:
        src = _section(residual, stream, s.name)
        if s.name.endswith("_res"):
            src = _rows_packed(src, cfg.residual_bits(s.name[0]), h, tp, d, 0, tp - rows)
        out[s.offset:s.offset + s.nbytes].copy_(src)
    return out


def window_of(anchor: torch.Tensor, stream: PageLayout, cfg: LynxConfig, h: int,
              d: int) -> int:
    """The recent rows a received anchor buffer carries (0: none), checking its size: either
    the stream layout's, or that plus the window it declares. Raises ValueError naming both."""
    n, base = anchor.numel(), stream.anchor_nbytes
    if n == base:
        return 0
    start = window_start(stream)
    limit = min(cfg.recent_tokens, stream.num_tokens)
    if not limit or n < start + 4:
        raise ValueError(f"anchor page buffer has {n} bytes; the layout needs {base}"
                         + (f" (or more, with a window of 1..{limit} recent rows)" if limit
                            else ""))
    rows = int.from_bytes(bytes(anchor[start:start + 4].tolist()), "little")
    if not 1 <= rows <= limit:
        raise ValueError(f"anchor page buffer declares a window of {rows} recent rows; this "
                         f"page of {stream.num_tokens} tokens may carry 1..{limit}")
    want = start + window_layout(cfg, h, d, stream.num_tokens, rows)[1]
    if n != want:
        raise ValueError(f"anchor page buffer has {n} bytes; with its window of {rows} recent "
                         f"rows the layout needs {want}")
    return rows


def window_residual(anchor: torch.Tensor, stream: PageLayout, cfg: LynxConfig, h: int, d: int,
                    rows: int, sent: torch.Tensor | None = None) -> torch.Tensor:
    """A windowed page's whole residual (the stream layout's, which the kernels read) from
    its anchor (1-D, its window checked by ``window_of``) and ``sent``, its residual stream
    (1-D, ``trim_residual``'s bytes): each head's rows from ``sent``, then the window's. At the
    anchor stage (``sent`` None) the rows before the window are zero (exactly the anchor stage)
    and the exact scalars are the expanded previews, with the window's chunks exact.
    Raises ValueError if ``sent`` has another size than the layout's."""
    tp = stream.num_tokens
    sections, _ = window_layout(cfg, h, d, tp, rows)
    tail = anchor[window_start(stream):]
    sent_sections, sent_nbytes = windowed_residual(cfg, stream, h, d, rows)
    if sent is not None and sent.numel() != sent_nbytes:
        raise ValueError(f"residual page buffer has {sent.numel()} bytes; with its window of "
                         f"{rows} recent rows the layout needs {sent_nbytes}")
    if sent is not None and not rows_left_out(stream, rows):
        return sent.clone()  # a page all window: its residual was sent whole
    out = torch.zeros(stream.residual_nbytes, dtype=torch.uint8, device=anchor.device)
    for which in "kv":
        r = cfg.residual_bits(which)
        wres = next(s for s in sections if s.name == which + "_wres")
        if sent is None:
            body = torch.zeros(packed_nbytes(h * (tp - rows) * d, r), dtype=torch.uint8,
                               device=anchor.device)
        else:
            body = _section(sent, sent_sections, which + "_res")
        _section(out, stream, which + "_res").copy_(_cat_rows(
            body, tp - rows, tail[wres.offset:wres.offset + wres.nbytes], rows, r, h, d))
        if not stats_in_residual(cfg):
            continue  # the exact scalars are in the anchor already
        if sent is not None:
            _section(out, stream, which + "_stats").copy_(_section(sent, sent_sections,
                                                                   which + "_stats"))
            continue
        u = _section(anchor, stream, which + "_preview").view(2, -1)
        stats = expand(u)
        wst = next(s for s in sections if s.name == which + "_wstats")
        exact = tail[wst.offset:wst.offset + wst.nbytes].view(SCALAR_DTYPE)
        view = _window_stats(stats, cfg, which, h, tp, d, rows)
        view.copy_(exact.view(view.shape))
        _section(out, stream, which + "_stats").copy_(stats.reshape(-1).view(torch.uint8))
    return out
