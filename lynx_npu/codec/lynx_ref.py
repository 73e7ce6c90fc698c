"""Reference Lynx hierarchical quantization (Algorithm 1, corrected per DESIGN §3).

This file is the specification every kernel (Triton, CPU, Ascend C) reproduces byte for byte.
All arithmetic is float32 in this order:

  encode  gmin, gmax = min, max over the page's tokens, per channel   (stored in the KV dtype)
          scale = gmax - gmin;  xn = (x - gmin) * (1 / scale)   (0 where 1 / scale is not
                                                        finite: a constant channel)
          c = (max + min) / 2 over the chunk                  (center="midrange", default)
            = tree_sum(xn over chunk) / count                  (center="mean", the paper's)
          mu = grid(c)  (scalar_grid="byte", default: lynx_tables.mu_on_grid)  or  f16(c)
          xc = xn - mu
          sigma = the smallest byte-grid level >= max |xc| over the chunk
                  (lynx_tables.sigma_index)  or  f16(max |xc|) (scalar_grid="float16")
          xf = xc * (1 / sigma)   (0 where sigma == 0)
          I = #{j : thresholds[j] <= |xf|}          (lynx_tables.py; round-half-up of Eq. 3)
          m = (I + bias) >> r;  d = (m << r) - I     (round-half-down split, Alg. 1 l.14-17)
          res = d in a middle cell; 2 d + 1 - (|xf| >= split[I]) in the end cells m = 0 and
                m = y_max >> r (lynx_tables "the end cells"), as an r-bit two's complement field
          anchor = m if xf >= 0 else -m - 1           (sign of the *centred* value, l.18)
  decode  x' = ((+-magnitudes[(m << r) | f]) * sigma + mu) * scale + gmin,  f = 0 (anchor
          stage) or res mod 2^r (full stage),  saturated to the KV dtype's finite range, then
          cast (base.to_kv_dtype)

The two normalisations multiply by a reciprocal computed once per channel / chunk (each
rounded: RN(RN(x - gmin) * RN(1 / scale))), not divide per value: IEEE multiplication is one
instruction on every device (a division is a polynomial on GPUs and a slow vector op on the
Ascend AI Core), and the result differs from the division by at most an ulp.
"""
from __future__ import annotations

import torch

from . import lynx_tables
from .base import to_kv_dtype
from .lynx_config import LynxConfig
from .lynx_layout import SCALAR_DTYPE


def reciprocal_or_zero(s: torch.Tensor) -> torch.Tensor:
    """float32 RN(1 / s), or 0 where that is not finite (s == 0, or s below 2**-128 where the
    reciprocal overflows): the values it multiplies then normalise to 0."""
    r = 1.0 / s
    return torch.where(torch.isfinite(r), r, torch.zeros_like(r))


def range_error(which: str, x: torch.Tensor) -> str:
    """The refusal of finite input that no page can carry: a channel whose range over a page
    (max - min) is not finite in float32 (bfloat16 / float32 KV beyond +-2^127), since every
    value is normalised by that range. The CPU kernel refuses exactly the same pages."""
    lo, hi = (float(t) for t in torch.aminmax(x.float()))
    return (f"{which} spans [{lo:g}, {hi:g}]: a page channel's range (max - min) overflows "
            f"float32, which Lynx normalises by; keep |{which}| below 2**127")


def _chunked(xn: torch.Tensor, axis: str, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, H, Tp, D] -> ([n, H, A, nc, C] zero-padded, validity mask of the same shape)."""
    t = xn.transpose(2, 3) if axis == "channel" else xn  # chunked axis last
    length = t.shape[-1]
    nc = -(-length // chunk)
    pad = nc * chunk - length
    mask = torch.ones(length, dtype=torch.bool, device=xn.device)
    if pad:
        t = torch.nn.functional.pad(t, (0, pad))
        mask = torch.nn.functional.pad(mask, (0, pad))
    return t.reshape(*t.shape[:-1], nc, chunk), mask.view(nc, chunk)


def tree_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last axis in a fixed order: pairwise over adjacent elements, zero-padded to
    a power of two. float32 addition is not associative; fixing the order makes the chunk
    mean, and so every code, reproducible by any backend (Ascend's WholeReduceSum order)."""
    n = x.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    if width != n:
        x = torch.nn.functional.pad(x, (0, width - n))
    while x.shape[-1] > 1:
        x = x[..., 0::2] + x[..., 1::2]
    return x[..., 0]


def _unchunked(t: torch.Tensor, axis: str, length: int) -> torch.Tensor:
    t = t.reshape(*t.shape[:-2], -1)[..., :length]
    return t.transpose(2, 3) if axis == "channel" else t


def _stats_order(s: torch.Tensor, axis: str) -> torch.Tensor:
    """[n, H, A, nc] -> layout order [n, H*...] (channel: [H, nc, D]; token: [H, Tp, nc])."""
    s = s.transpose(2, 3) if axis == "channel" else s
    return s.reshape(s.shape[0], -1)


def _stats_unorder(s: torch.Tensor, axis: str, num_heads: int, a_len: int) -> torch.Tensor:
    n = s.shape[0]
    if axis == "channel":
        return s.view(n, num_heads, -1, a_len).transpose(2, 3)
    return s.view(n, num_heads, a_len, -1)


def page_range(xf32: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each page channel's min and max over its tokens: [n, H, 1, D] each (the page's ``gamma``)."""
    return xf32.amin(dim=2, keepdim=True), xf32.amax(dim=2, keepdim=True)


def quantize(x: torch.Tensor, cfg: LynxConfig, which: str):
    """Quantize ``n`` pages of equal length. x: [n, H, Tp, D] (any float dtype).

    Returns (anchor [n,H,Tp,D] int64 signed, residual [n,H,Tp,D] int64 signed,
    gamma [n, 2, H*D] in x.dtype, stats [n, 2, num_chunks] float16).
    """
    n, h, tp, d = x.shape
    axis = cfg.axis(which)
    xf32 = x.float()
    gmin, gmax = page_range(xf32)
    if not bool(torch.isfinite(gmax - gmin).all()):
        raise ValueError(range_error(which, x))
    inv_scale = reciprocal_or_zero(gmax - gmin)
    xn = (xf32 - gmin) * inv_scale

    chunks, mask = _chunked(xn, axis, cfg.chunk(which))
    if cfg.center == "midrange":
        big = torch.finfo(torch.float32).max
        hi = torch.where(mask, chunks, -big).amax(dim=-1)
        lo = torch.where(mask, chunks, big).amin(dim=-1)
        centre = (hi + lo) / 2
    else:
        count = mask.sum(dim=-1).to(torch.float32)
        centre = tree_sum(chunks) / count
    byte = cfg.scalar_grid == "byte"
    mu = (lynx_tables.mu_on_grid(centre) if byte else centre).to(SCALAR_DTYPE)
    xc = chunks - mu.float().unsqueeze(-1)
    need = torch.where(mask, xc.abs(), 0.0).amax(dim=-1)
    if byte:
        need = lynx_tables.sigma_levels(x.device)[lynx_tables.sigma_index(need)]
    sigma = need.to(SCALAR_DTYPE)
    xfin = xc * reciprocal_or_zero(sigma.float().unsqueeze(-1))
    xfin = _unchunked(xfin, axis, tp if axis == "channel" else d)

    r = cfg.residual_bits(which)
    thr = lynx_tables.thresholds(cfg.alpha(which), cfg.y_max(which), device=x.device)
    a = xfin.abs().contiguous()
    i = torch.searchsorted(thr, a, right=True).to(torch.int64)
    m = (i + cfg.bias(which)) >> r
    d = (m << r) - i
    split = lynx_tables.split_thresholds(cfg.alpha(which), cfg.y_max(which), r, device=x.device)
    h = (a >= split[i]).to(torch.int64)
    end = (m == 0) | (m == cfg.y_max(which) >> r)
    field = torch.where(end, 2 * d + 1 - h, d) & ((1 << r) - 1)
    residual = field - ((field >> (r - 1)) << r)  # the r-bit field, signed
    anchor = torch.where(xfin < 0, -m - 1, m)

    gamma = torch.stack([gmin.reshape(n, -1), gmax.reshape(n, -1)], dim=1).to(x.dtype)
    stats = torch.stack([_stats_order(mu, axis), _stats_order(sigma, axis)], dim=1)
    return anchor, residual, gamma, stats


def dequantize(anchor: torch.Tensor, residual: torch.Tensor | None, gamma: torch.Tensor,
               stats: torch.Tensor, cfg: LynxConfig, which: str, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`quantize`; ``residual=None`` gives the anchor stage. -> [n,H,Tp,D]."""
    n, h, tp, d = anchor.shape
    axis = cfg.axis(which)
    r = cfg.residual_bits(which)
    neg = anchor < 0
    m = torch.where(neg, -anchor - 1, anchor)
    idx = m << r
    if residual is not None:
        idx = idx | (residual & ((1 << r) - 1))
    mags = lynx_tables.magnitudes(cfg.alpha(which), cfg.y_max(which), r, device=anchor.device)
    mag = mags[idx]
    xfin = torch.where(neg, -mag, mag)

    a_len = tp if axis == "channel" else d
    mu = _stats_unorder(stats[:, 0].float(), axis, h, d if axis == "channel" else tp)
    sigma = _stats_unorder(stats[:, 1].float(), axis, h, d if axis == "channel" else tp)
    chunks, _ = _chunked(xfin, axis, cfg.chunk(which))
    xn = _unchunked(chunks * sigma.unsqueeze(-1) + mu.unsqueeze(-1), axis, a_len)

    g = gamma.float().view(n, 2, h, 1, d)
    gmin, gmax = g[:, 0], g[:, 1]
    return to_kv_dtype(xn * (gmax - gmin) + gmin, dtype)
