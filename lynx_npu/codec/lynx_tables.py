"""Quantization tables of the alpha-law transform: the single source of the log/exp math.

Eq. (3) of the Lynx paper, y = ln(1 + alpha|x|) / ln(1 + alpha) * y_max, is never evaluated on
the data. Instead every backend compares |x| against the float32 ``thresholds`` (the inverse
transform at the half-integers, so I = round-half-up(y) = #{j : thresholds[j] <= |x|}) and
dequantizes with the float32 ``levels`` table. Transcendentals are thus computed once, here, in
float64, and codes are bit-identical across devices whatever their libm.
"""
from __future__ import annotations

import functools
import math

import torch


def _inverse(y: float, alpha: float, y_max: int) -> float:
    return math.expm1(y / y_max * math.log1p(alpha)) / alpha


@functools.lru_cache(maxsize=256)
def _tables(alpha: float, y_max: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    thresholds = tuple(_inverse(j - 0.5, alpha, y_max) for j in range(1, y_max + 1))
    levels = [0.0] + [_inverse(j, alpha, y_max) for j in range(1, y_max)] + [1.0]
    return thresholds, tuple(levels)


def thresholds(alpha: float, y_max: int, device=None) -> torch.Tensor:
    """float32 [y_max]: code j is chosen when |x| >= thresholds[j-1]."""
    return torch.tensor(_tables(float(alpha), y_max)[0], dtype=torch.float32, device=device)


def levels(alpha: float, y_max: int, device=None) -> torch.Tensor:
    """float32 [y_max + 1]: reconstructed |x| of each code; levels[0] = 0, levels[y_max] = 1."""
    return torch.tensor(_tables(float(alpha), y_max)[1], dtype=torch.float32, device=device)


# -- the byte grid of chunk scalars (LynxConfig.scalar_grid == "byte") -----------------------------
#
# mu and sigma live in the page-normalised domain. On the byte grid each is one of 256 values,
# so the streams carry one byte per scalar, once (lynx_stream.py), and the kernels keep writing
# float16 stats that lie on the grid (every level is a float16 value): decompression is unchanged.
#   mu    = u / 256, u = min(255, floor(256 c + 1/2))       (c: the float32 chunk centre)
#   sigma = the smallest level >= max |xn - mu| over the chunk (chosen after rounding mu, so
#           nothing clips): 0; 254 geometric levels 2^SIGMA_LOW_LOG2 .. 2^-1 (both exact); and
#           0.5 + 2^-8, which covers a chunk spanning its page channel's whole range whatever
#           the rounding of mu (max |xn - mu| <= 0.5 + 2^-9).
# docs/codec.md "Scalars sent once" measured the grid; SIGMA_LOW_LOG2 trades the anchor's error
# (finer steps) against chunks far narrower than their page channel (they get sigma 2^-6).

MU_STEPS = 256
SIGMA_LOW_LOG2 = -6.0
SIGMA_TOP = 0.5 + 2.0 ** -8


@functools.lru_cache(maxsize=None)
def _sigma_levels() -> tuple[float, ...]:
    geo = [2.0 ** (SIGMA_LOW_LOG2 + u * (-1.0 - SIGMA_LOW_LOG2) / 253) for u in range(254)]
    geo[-1] = 0.5
    exact = torch.tensor([0.0] + geo + [SIGMA_TOP], dtype=torch.float64)
    lv = exact.to(torch.float16).to(torch.float64)
    assert bool((lv[1:] > lv[:-1]).all()) and lv[-1] == SIGMA_TOP
    return tuple(lv.tolist())


def sigma_levels(device=None) -> torch.Tensor:
    """float32 [256]: the sigma of each byte (float16 values, increasing; [0] = 0)."""
    return torch.tensor(_sigma_levels(), dtype=torch.float32, device=device)


def mu_on_grid(centre: torch.Tensor) -> torch.Tensor:
    """float32 chunk centres (page-normalised, >= 0) -> float32 mu on the grid. 256 c + 1/2 is
    exact in float32 below 256, so this is round-half-up in every backend."""
    u = torch.floor(centre.float() * MU_STEPS + 0.5).clamp(0, MU_STEPS - 1)
    return u * (1.0 / MU_STEPS)


def sigma_index(need: torch.Tensor) -> torch.Tensor:
    """float32 max |xn - mu| -> int64 byte of the smallest level >= it (#{j : levels[j] <
    need}, at most 255): what a branch-free binary search over the 256 levels gives."""
    lv = sigma_levels(need.device)
    return torch.searchsorted(lv, need.float().contiguous(), right=False).clamp(max=255)
