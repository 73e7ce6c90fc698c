"""Lookup tables the compiled kernels take as inputs (derived from codec/lynx_tables.py).

Kernels never evaluate log/exp. Encoding needs I = #{j : thresholds[j] <= |x|}; a binary
search over 112 thresholds is too slow on every device, so this file precomputes a *bucket*
index over the float32 bit pattern of |x| (monotone for x >= 0):

    key = min(bits(|x|), bits(1.0)) >> shift;   b = max(key - key_lo, 0)
    I   = bucket[b];  repeat num_probes times: I += (thresholds_padded[I] <= |x|)

``bucket[b]`` is the exact count of thresholds <= the bucket's lower edge (0 for bucket 0),
and ``num_probes`` the most thresholds inside any bucket, so the probes finish the count
exactly (the thresholds are sorted; the padding is +inf). ``shift`` keeps 23 - shift
mantissa bits per octave: buckets are fine near 0 and coarse near 1, like the alpha-law
thresholds themselves. Everything here is exact float32 comparison: the codes equal
``searchsorted(thresholds, |x|, right=True)`` bit for bit.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from lynx_npu.codec import lynx_tables

ONE_BITS = 0x3F800000          # float32 bit pattern of 1.0
TABLE_LEN = 128                # padded length of the thresholds / levels rows (y_max <= 126)
_MANTISSA_BITS = range(3, 9)   # candidate bucket resolutions per octave (2**m buckets)


@dataclass(frozen=True)
class QuantTables:
    """One (alpha, y_max) table set, as numpy arrays (the backends move them to devices)."""

    thresholds: np.ndarray   # float32 [TABLE_LEN + 2]: thresholds then +inf padding
    levels: np.ndarray       # float32 [TABLE_LEN]: levels[0..y_max], then 1.0 padding
    bucket: np.ndarray       # uint8 [num_buckets]
    shift: int               # bits(|x|) >> shift is the bucket key
    key_lo: int              # key of bucket 0
    num_probes: int          # threshold comparisons after the bucket lookup (>= 1)


def _buckets(thr: np.ndarray, mbits: int) -> tuple[np.ndarray, int, int, int]:
    shift = 23 - mbits
    key_lo = int(thr.view(np.int32)[0]) >> shift
    key_hi = ONE_BITS >> shift
    keys = np.arange(key_lo, key_hi + 1, dtype=np.int64)
    lo = (keys << shift).astype(np.int32).view(np.float32).copy()
    lo[0] = 0.0  # bucket 0 also takes every |x| below its own edge
    hi = ((keys + 1) << shift).astype(np.int32).view(np.float32)
    base = np.searchsorted(thr, lo, side="right")
    inside = np.searchsorted(thr, hi, side="left") - base
    return base.astype(np.uint8), shift, key_lo, max(int(inside.max()), 1)


@functools.lru_cache(maxsize=64)
def quant_tables(alpha: float, y_max: int) -> QuantTables:
    if not 1 <= y_max < TABLE_LEN:
        raise ValueError(f"{y_max=} must be in [1, {TABLE_LEN - 1}]")
    thr = lynx_tables.thresholds(alpha, y_max).numpy()
    lv = lynx_tables.levels(alpha, y_max).numpy()
    # The smallest bucket table that needs a single probe (two for extreme alphas).
    best = None
    for m in _MANTISSA_BITS:
        cand = _buckets(thr, m)
        best = cand
        if cand[3] == 1:
            break
    bucket, shift, key_lo, probes = best
    thr_pad = np.full(TABLE_LEN + 2, np.inf, dtype=np.float32)
    thr_pad[:y_max] = thr
    lv_pad = np.ones(TABLE_LEN, dtype=np.float32)
    lv_pad[:y_max + 1] = lv
    return QuantTables(thr_pad, lv_pad, bucket, shift, key_lo, probes)


def codes_via_buckets(x_abs: torch.Tensor, t: QuantTables) -> torch.Tensor:
    """The kernels' lookup in torch (for tests and documentation): |x| float32 -> I int64."""
    bits = x_abs.float().contiguous().view(torch.int32).clamp(max=ONE_BITS)
    b = ((bits >> t.shift) - t.key_lo).clamp(min=0).long()
    i = torch.from_numpy(t.bucket.astype(np.int64))[b]
    thr = torch.from_numpy(t.thresholds)
    for _ in range(t.num_probes):
        i = i + (thr[i] <= x_abs).long()
    return i


@functools.lru_cache(maxsize=64)
def _stacked(alpha_k: float, alpha_v: float, y_max: int):
    tk, tv = quant_tables(alpha_k, y_max), quant_tables(alpha_v, y_max)
    nb = max(len(tk.bucket), len(tv.bucket))
    bucket = np.zeros((2, nb), dtype=np.uint8)
    bucket[0, :len(tk.bucket)] = tk.bucket
    bucket[1, :len(tv.bucket)] = tv.bucket
    return (np.stack([tk.thresholds, tv.thresholds]), np.stack([tk.levels, tv.levels]),
            bucket, (tk, tv))


_DEVICE_CACHE: dict = {}


def device_tables(cfg, device: torch.device) -> dict:
    """K and V tables of ``cfg`` stacked as [2, ...] tensors on ``device`` (cached)."""
    key = (cfg.alpha_k, cfg.alpha_v, cfg.y_max, str(device))
    hit = _DEVICE_CACHE.get(key)
    if hit is None:
        thr, lv, bucket, (tk, tv) = _stacked(float(cfg.alpha_k), float(cfg.alpha_v), cfg.y_max)
        hit = {
            "thresholds": torch.from_numpy(thr).to(device),
            "levels": torch.from_numpy(lv).to(device),
            "bucket": torch.from_numpy(bucket).to(device),
            "bucket_len": bucket.shape[1],
            "k": tk,
            "v": tv,
        }
        _DEVICE_CACHE[key] = hit
    return hit
