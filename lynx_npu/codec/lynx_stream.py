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

Previews are made once by the encoder (this torch code, for every backend: they cost a pass
over 1/32 of the values) and expanded by a 256-entry table lookup. ``to_stream`` and
``from_stream`` move whole pages between the kernel layout (lynx_npu.ops) and the streams.
"""
from __future__ import annotations

import functools

import torch

from .lynx_layout import SCALAR_DTYPE, PageLayout

SIGMA_MIN_LOG2 = -14.0
_SIGMA_STEPS = 254  # geometric steps between levels 1 and 255


@functools.lru_cache(maxsize=None)
def preview_levels() -> torch.Tensor:
    """float32 [2, 256]: the value each preview byte stands for (row 0 mu, row 1 sigma)."""
    u = torch.arange(256, dtype=torch.float64)
    mu = u / 255
    sigma = torch.exp2(SIGMA_MIN_LOG2 + (u - 1) * (-SIGMA_MIN_LOG2 / _SIGMA_STEPS))
    sigma[0] = 0
    return torch.stack([mu, sigma]).to(SCALAR_DTYPE).float()


def preview(stats: torch.Tensor) -> torch.Tensor:
    """[..., 2, nc] float16 (mu, sigma) -> [..., 2, nc] uint8 previews."""
    s = stats.float()
    mu, sigma = s[..., 0, :], s[..., 1, :]
    u_mu = torch.round(mu.clamp(0, 1) * 255)
    steps = (torch.log2(sigma.clamp_min(2.0 ** SIGMA_MIN_LOG2)) - SIGMA_MIN_LOG2) \
        * (_SIGMA_STEPS / -SIGMA_MIN_LOG2)
    u_sigma = torch.where(sigma > 0, 1 + torch.round(steps).clamp(0, _SIGMA_STEPS), 0)
    return torch.stack([u_mu, u_sigma], dim=-2).to(torch.uint8)


def expand(previews: torch.Tensor) -> torch.Tensor:
    """[..., 2, nc] uint8 -> [..., 2, nc] float16 stand-ins for (mu, sigma)."""
    lv = preview_levels().to(previews.device)
    idx = previews.long()
    return torch.stack([lv[0][idx[..., 0, :]], lv[1][idx[..., 1, :]]], dim=-2).to(SCALAR_DTYPE)


def _view(buf: torch.Tensor, lay: PageLayout, name: str) -> torch.Tensor:
    s = lay.section(name)
    return buf[:, s.offset:s.offset + s.nbytes]


def to_stream(anchor: torch.Tensor, residual: torch.Tensor, kernel: PageLayout,
              stream: PageLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, kernel bytes] anchor / residual pages -> [n, stream bytes] (previews in the anchor,
    exact scalars after the residual codes)."""
    n = anchor.shape[0]
    a = torch.zeros(n, stream.anchor_nbytes, dtype=torch.uint8, device=anchor.device)
    r = torch.zeros(n, stream.residual_nbytes, dtype=torch.uint8, device=anchor.device)
    for s in stream.anchor:
        if s.name.endswith("_preview"):
            stats = _view(anchor, kernel, s.name[0] + "_stats").contiguous().view(SCALAR_DTYPE)
            a[:, s.offset:s.offset + s.nbytes] = preview(stats.view(n, 2, -1)).view(n, -1)
        else:
            a[:, s.offset:s.offset + s.nbytes] = _view(anchor, kernel, s.name)
    for s in stream.residual:
        src = residual if s.name.endswith("_res") else anchor
        r[:, s.offset:s.offset + s.nbytes] = _view(src, kernel, s.name)
    return a, r


def from_stream(anchor: torch.Tensor, residual: torch.Tensor | None, kernel: PageLayout,
                stream: PageLayout) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stream pages -> kernel-layout pages; without the residual the exact scalars are stood in
    for by the expanded previews (anchor stage)."""
    n = anchor.shape[0]
    a = torch.zeros(n, kernel.anchor_nbytes, dtype=torch.uint8, device=anchor.device)
    for s in kernel.anchor:
        dst = a[:, s.offset:s.offset + s.nbytes]
        if not s.name.endswith("_stats"):
            dst.copy_(_view(anchor, stream, s.name))
        elif residual is not None:
            dst.copy_(_view(residual, stream, s.name))
        else:
            u = _view(anchor, stream, s.name[0] + "_preview").reshape(n, 2, -1)
            dst.copy_(expand(u).view(torch.uint8).view(n, -1))
    if residual is None:
        return a, None
    r = torch.zeros(n, kernel.residual_nbytes, dtype=torch.uint8, device=anchor.device)
    for s in kernel.residual:
        r[:, s.offset:s.offset + s.nbytes] = _view(residual, stream, s.name)
    return a, r
