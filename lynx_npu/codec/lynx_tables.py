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
    """float32 [y_max + 1]: |x| at y = I for each code I; levels[0] = 0, levels[y_max] = 1. The
    anchor stage decodes magnitude m at levels[m << r]."""
    return torch.tensor(_tables(float(alpha), y_max)[1], dtype=torch.float32, device=device)


# -- the end cells (payload format 8) ------------------------------------------------------------
#
# The anchor keeps m = (I + bias) >> r, so a middle anchor cell m holds the 2^r codes
# I = (m << r) - bias .. (m << r) + 2^(r-1) and the residual field d = (m << r) - I names one.
# The two end cells hold fewer: m = 0 the 2^(r-1) + 1 codes 0 .. 2^(r-1), the top cell
# m = top = 2^(a-1) - 1 the 2^(r-1) codes y_max - bias .. y_max, so 31 of the 256 (anchor,
# residual) pairs of a 4 + 4 split meant nothing. The end cells spend them: each code interval
# [I - 1/2, I + 1/2) of an end cell (in y) is split at y = I into two, decoded at I -+ 1/4, but
# for two that stay whole, cell 0's [0, 1/2) (decoded 0, the anchor's level) and its
# [2^(r-1) - 1/2, 2^(r-1) + 1/2) (across the cell's upper edge); the top cell's last half is the
# point y = y_max (|x| = 1, the chunk extreme, the anchor's level). So 2^r levels per end cell,
# the anchor m, the anchor stage and residual field 0 = the anchor's level all as before:
#   h     = |x| >= split[I]             (split = levels but +inf at I = 2^(r-1) and middle cells)
#   field = d                           in a middle cell
#         = 2 d + 1 - h                 in an end cell (mod 2^r; 0 is the anchor's own level)
# and the decoder reads the magnitude of (m << r) | field from one 2^(a-1+r) = 128-entry table.
# Measured: docs/codec.md "The full stage's end cells".


def _end_cells(y_max: int, r: int) -> tuple[int, int]:
    """(the last code of cell 0, the first of the top cell)."""
    half = 1 << (r - 1)
    return half, y_max - (half - 1)


@functools.lru_cache(maxsize=256)
def _end_tables(alpha: float, y_max: int, r: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    lv = _tables(alpha, y_max)[1]
    lo_end, hi_start = _end_cells(y_max, r)
    split = [lv[i] if i < lo_end or i >= hi_start else math.inf for i in range(y_max + 1)]
    n, top = 1 << r, y_max >> r
    mags = []
    for m in range(top + 1):
        for field in range(n):
            if 0 < m < top:
                y = float((m << r) - (field - n if field >= n // 2 else field))
            elif m == 0:
                k = -field % n                                 # -field = 2 I - 1 + h
                i, h = (k + 1) >> 1, (k + 1) & 1
                y = float(i) if i in (0, lo_end) else i + (0.25 if h else -0.25)
            else:
                i, h = y_max - (field >> 1), 1 - (field & 1)   # field = 2 (y_max - I) + 1 - h
                y = float(i) if (i == y_max and h) else i + (0.25 if h else -0.25)
            mags.append(1.0 if y == y_max else (0.0 if y == 0 else _inverse(y, alpha, y_max)))
    return tuple(split), tuple(mags)


def split_thresholds(alpha: float, y_max: int, residual_bits: int, device=None) -> torch.Tensor:
    """float32 [y_max + 1]: an end cell's code I is split into h = (|x| >= split[I]): levels[I]
    in the end cells (so split[0] = 0: h = 1), +inf where the code stays whole (I = 2^(r-1))
    or is in a middle cell (h unused)."""
    return torch.tensor(_end_tables(float(alpha), y_max, residual_bits)[0], dtype=torch.float32,
                        device=device)


def magnitudes(alpha: float, y_max: int, residual_bits: int, device=None) -> torch.Tensor:
    """float32 [(top + 1) << r] (128 for every split of 8 bits): the decoded |x| of anchor
    magnitude m with residual field f (unsigned, r bits) at (m << r) | f. Field 0 is the
    anchor's level levels[m << r]; a middle cell's field f is code (m << r) - f (signed)."""
    return torch.tensor(_end_tables(float(alpha), y_max, residual_bits)[1], dtype=torch.float32,
                        device=device)


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
