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
