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

Two forms for the GPU kernels: ``log_search`` (compress: Eq. (3) in float32 places the code
within one, a 1 KB table of thresholds settles it exactly with one comparison) and
``signed_levels`` (float32 [256]: the decoded +-level of
each (anchor field << residual_bits | residual field) byte; the anchor stage reads residual 0,
packed as ``anchor_levels``).
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


MAGIC = 12582912.0     # 1.5 * 2**23: x + MAGIC rounds x (|x| < 2**22) to an integer in the bits
MAGIC_BITS = int(np.float32(MAGIC).view(np.int32))  # 0x4B400000: bits(x + MAGIC) - MAGIC_BITS
SEARCH_LEN = 256       # float32 entries of a LogSearch table (covers y_max + bias + 2 <= 256)


@dataclass(frozen=True)
class LogSearch:
    """The GPU compress kernel's code search: Eq. (3) evaluated once, approximately, then one
    exact threshold comparison (one 4-byte load per value from a 1 KB table):

        a  = min(|x|, 1.0)
        y' = scale * log2(fma(a, alpha, p0)) - eps         (scale = y_max / log2(1 + alpha))
        u0 = round(y') + bias + 1             (= bits(y' + MAGIC + bias + 1) - bits(MAGIC))
        u  = I + bias = u0 + ((bits(a) - bits(entries[u0])) >> 31)

    I = round-half-up(y), y = scale * log2(1 + alpha * a) exactly (with the float32
    thresholds: I = #{thresholds <= a}). If y' = y - b with err <= b < 0.5 - err, round(y') is
    I - 1 or I, and the comparison with thresholds[round(y')] = entries[u0] settles which
    (arithmetic shift: -1 below the threshold; entries holds +inf at y_max and past it).
    ``err`` bounds every error but the bias: the float32 log2 within 2**-21 absolute (the GPU's
    lg2.approx included), the rounding of p and of alpha, the thresholds' rounding. The bias b:

    * p0 = 1 - delta, eps = 0 (when alpha is not huge): b = scale * -log2(1 - delta / q),
      q = 1 + alpha * a in [1, 1 + alpha], so b >= scale * delta / ((1 + alpha) ln 2) = 2 err
      and b <= scale * delta / ((1 - delta) ln 2); round(y') then comes out of the same fma as
      the product (fma(lg, scale, MAGIC + bias + 1)): no separate subtraction.
    * else p0 = 1, eps = 2 err: b = eps.
    """

    alpha: float
    scale: float
    p0: float
    eps: float
    entries: np.ndarray   # float32 [SEARCH_LEN]


def log_search(alpha: float, y_max: int, bias: int) -> LogSearch:
    f32 = np.float32
    scale = float(f32(y_max / np.log2(1.0 + alpha)))
    err = scale * 2.0 ** -20
    # bias by p0 = 1 - delta: delta rounded up to the float32 spacing below 1 (2**-24)
    delta = np.ceil(2.0 * err * (1.0 + alpha) * np.log(2.0) / scale * 2.0 ** 24) * 2.0 ** -24
    if delta < 0.5 and scale * delta / ((1.0 - delta) * np.log(2.0)) + err < 0.5 - err:
        p0, eps = float(f32(1.0 - delta)), 0.0
    else:
        err += 2.0 ** -16  # the separate fma's rounding of y - eps (y < 2**7)
        p0, eps = 1.0, 2.0 * err
        if eps + err >= 0.5:
            raise ValueError(f"alpha={alpha} is too small for the log-search code lookup "
                             f"(scale {scale:.3g}: float32 log2 cannot place y within 0.25)")
    if y_max + bias + 2 > SEARCH_LEN:
        raise ValueError(f"{y_max=} with {bias=} exceeds the {SEARCH_LEN}-entry search table")
    entries = np.full(SEARCH_LEN, np.inf, dtype=np.float32)
    entries[bias + 1:bias + 1 + y_max] = lynx_tables.thresholds(alpha, y_max).numpy()
    return LogSearch(float(f32(alpha)), scale, p0, eps, entries)


POLY_MARGIN = 2.0 ** -10   # slack kept at every threshold: >> the float32 rounding of the fma


@dataclass(frozen=True)
class PolySearch:
    """A quadratic in place of Eq. (3)'s log2 in the GPU compress search, for alphas small
    enough that the alpha-law is nearly linear (the defaults):

        J  = floor(fma(fma(a, c2, c1), a, 0))     (one rounding: toward -inf, with MAGIC)
        u0 = J + bias + 1,   u = u0 + ((bits(a) - bits(entries[u0])) >> 31)   (LogSearch's)

    J is I - 1 or I for every a in [0, 1] when P(a) = c1 a + c2 a**2 is increasing on [0, 1]
    and P(t_k) lies in [k - 1, k] for every threshold t_k (then P(a) is in [I - 1, I + 1)
    between thresholds); ``poly_search`` checks that, with POLY_MARGIN to spare, on the
    float32 coefficients, so the entries settle I exactly as after the log. Two fmas instead
    of fma, lg2 (MUFU) and fma."""

    c1: float
    c2: float


@functools.lru_cache(maxsize=64)
def poly_search(alpha: float, y_max: int) -> PolySearch | None:
    """The quadratic of ``PolySearch`` for (alpha, y_max), or None where no quadratic keeps
    every threshold within its window (large alphas: the log search then)."""
    thr = lynx_tables.thresholds(alpha, y_max).numpy().astype(np.float64)
    k = np.arange(1, len(thr) + 1, dtype=np.float64)
    a = np.stack([thr, thr * thr], 1)
    w = np.ones_like(k)
    for _ in range(100):  # Lawson: least squares reweighted towards the minimax fit
        c, *_ = np.linalg.lstsq(a * w[:, None], (k - 0.5) * w, rcond=None)
        w = w * np.sqrt(np.abs(a @ c - (k - 0.5))) + 1e-12
        w /= w.max()
    c1, c2 = (float(np.float32(v)) for v in c)
    p = c1 * thr + c2 * thr * thr
    ok = (c1 > 0 and c1 + 2 * c2 > 0                         # increasing on [0, 1]
          and bool(np.all(p >= k - 1 + POLY_MARGIN)) and bool(np.all(p <= k - POLY_MARGIN))
          and c1 + c2 < len(thr) + 1 - POLY_MARGIN           # P(1) < y_max + 1
          and abs(c1) + abs(c2) < 2.0 ** 10)                 # fma rounding << POLY_MARGIN
    return PolySearch(c1, c2) if ok else None


def codes_via_poly_search(x_abs: torch.Tensor, poly: PolySearch, s: LogSearch,
                          bias: int) -> torch.Tensor:
    """The Triton compress kernel's quadratic search in torch (tests): |x| -> I int64, the
    inner fma rounded once (through float64), the outer floored exactly."""
    a = x_abs.float().clamp(max=1.0)
    r = (a.double() * poly.c2 + poly.c1).float()
    return _settle(a, torch.floor(r.double() * a.double()).long() + bias + 1, s, bias)


def codes_via_log_search(x_abs: torch.Tensor, s: LogSearch, bias: int,
                         log_error: float = 0.0) -> torch.Tensor:
    """The Triton compress kernel's search in torch (tests): |x| -> I int64, each fma rounded
    once (through float64). ``log_error`` is added to every log2, to show that the result
    does not depend on it (|log_error| <= 2**-21)."""
    a = x_abs.float().clamp(max=1.0)
    p = (a.double() * s.alpha + s.p0).float()
    lg = torch.log2(p).double() + log_error
    magic = MAGIC + bias + 1
    if s.eps:
        w = ((lg * s.scale - s.eps).float() + magic).float()
    else:
        w = (lg * s.scale + magic).float()
    return _settle(a, (w.view(torch.int32) - MAGIC_BITS).long(), s, bias)


def _settle(a: torch.Tensor, u0: torch.Tensor, s: LogSearch, bias: int) -> torch.Tensor:
    """I from the estimate u0 = J + bias + 1 (J = I - 1 or I): one comparison of a with the
    threshold at u0, in the bits (both >= 0), as the kernel does."""
    t = torch.from_numpy(s.entries)[u0]
    return u0 + ((a.view(torch.int32) - t.view(torch.int32)) >> 31).long() - bias


@functools.lru_cache(maxsize=64)
def signed_levels(alpha: float, y_max: int, anchor_bits: int) -> np.ndarray:
    """float32 [256]: entry (ua << r) | ur is the value lynx_ref.dequantize gives the signed
    anchor / residual bit fields ua / ur (r = 8 - anchor_bits): +-magnitudes[(m << r) | ur]."""
    r = 8 - anchor_bits
    mags = lynx_tables.magnitudes(alpha, y_max, r).numpy()
    u = np.arange(256)
    ua, ur = u >> r, u & ((1 << r) - 1)
    a = ua - ((ua >> (anchor_bits - 1)) << anchor_bits)   # sign-extend
    neg = a < 0
    m = np.where(neg, -a - 1, a)
    mag = mags[(m << r) | ur]
    return np.where(neg, -mag, mag).astype(np.float32)


@functools.lru_cache(maxsize=64)
def _stacked(alpha_k: float, y_max_k: int, alpha_v: float, y_max_v: int):
    tk, tv = quant_tables(alpha_k, y_max_k), quant_tables(alpha_v, y_max_v)
    nb = max(len(tk.bucket), len(tv.bucket))
    bucket = np.zeros((2, nb), dtype=np.uint8)
    bucket[0, :len(tk.bucket)] = tk.bucket
    bucket[1, :len(tv.bucket)] = tv.bucket
    return (np.stack([tk.thresholds, tv.thresholds]), np.stack([tk.levels, tv.levels]),
            bucket, (tk, tv))


def _padded(a: np.ndarray, n: int) -> np.ndarray:
    return np.concatenate([a, np.zeros(n - len(a), dtype=a.dtype)])


def _end_table(fn, alpha: float, y_max: int, r: int, fill: float) -> np.ndarray:
    out = np.full(TABLE_LEN, fill, dtype=np.float32)
    t = fn(alpha, y_max, r).numpy()
    out[:len(t)] = t
    return out


_DEVICE_CACHE: dict = {}


def device_tables(cfg, device: torch.device) -> dict:
    """K and V tables of ``cfg`` (each with its alpha and split) stacked as [2, ...] tensors
    on ``device`` (cached)."""
    key = (cfg.alpha_k, cfg.alpha_v, cfg.anchor_bits, cfg.v_anchor_bits, str(device))
    hit = _DEVICE_CACHE.get(key)
    if hit is None:
        kv = [(float(cfg.alpha(w)), cfg.y_max(w), cfg.bits(w), cfg.residual_bits(w)) for w in "kv"]
        thr, lv, bucket, (tk, tv) = _stacked(*kv[0][:2], *kv[1][:2])
        hit = {
            "thresholds": torch.from_numpy(thr).to(device),
            "levels": torch.from_numpy(lv).to(device),
            # the end cells (lynx_tables): split thresholds [2, TABLE_LEN] (+inf padded) and the
            # magnitude of each (m << r) | residual field [2, TABLE_LEN]
            "split": torch.from_numpy(np.stack([
                _end_table(lynx_tables.split_thresholds, a, y, r, np.inf) for a, y, _, r in kv
            ])).to(device),
            "magnitudes": torch.from_numpy(np.stack([
                _end_table(lynx_tables.magnitudes, a, y, r, 1.0) for a, y, _, r in kv
            ])).to(device),
            "bucket": torch.from_numpy(bucket).to(device),
            "bucket_len": bucket.shape[1],
            "signed_levels": torch.from_numpy(np.stack([
                signed_levels(a, y, b) for a, y, b, _ in kv])).to(device),
            # the anchor stage's entries (ua << r) packed at ua: 2**anchor_bits neighbours, so
            # a warp's lookups spread over the banks instead of every 2**r-th word
            "anchor_levels": torch.from_numpy(np.stack([
                _padded(signed_levels(a, y, b)[np.arange(1 << b) << r], 256)
                for a, y, b, r in kv])).to(device),
            "k": tk,
            "v": tv,
        }
        _DEVICE_CACHE[key] = hit
    return hit


def search_tables(cfg, device: torch.device
                  ) -> tuple[list[LogSearch], list[PolySearch | None], torch.Tensor]:
    """K and V LogSearch and PolySearch (None: the log) of ``cfg``, and the entries stacked
    [2, SEARCH_LEN] on ``device``."""
    key = ("search", cfg.alpha_k, cfg.alpha_v, cfg.anchor_bits, cfg.v_anchor_bits, str(device))
    hit = _DEVICE_CACHE.get(key)
    if hit is None:
        searches = [log_search(float(cfg.alpha(w)), cfg.y_max(w), cfg.bias(w)) for w in "kv"]
        hit = (searches, [poly_search(float(cfg.alpha(w)), cfg.y_max(w)) for w in "kv"],
               torch.from_numpy(np.stack([s.entries for s in searches])).to(device))
        _DEVICE_CACHE[key] = hit
    return hit


def recip_table(device: torch.device) -> torch.Tensor:
    """float32 [1024]: entry k = RN(1 / (1 + k / 1024)) (IEEE float32 division), the reciprocal
    of every 11-bit significand: the compress kernel's exact 1 / sigma for float16 sigma."""
    key = ("recip", str(device))
    hit = _DEVICE_CACHE.get(key)
    if hit is None:
        m = np.float32(1.0) + np.arange(1024, dtype=np.float32) / np.float32(1024.0)
        hit = torch.from_numpy(np.float32(1.0) / m).to(device)
        _DEVICE_CACHE[key] = hit
    return hit
