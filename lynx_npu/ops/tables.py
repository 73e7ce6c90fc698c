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

Two forms for the GPU kernels: ``log_search`` (compress: Eq. (3) in float32 places the code,
on a half-step grid for the end cells' splits, within one, and one comparison with an entry of
a 2 KB table settles it exactly and gives the stored code byte) and
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
SEARCH_LEN = 256       # 8-byte entries of a search table (half-step counts 0 .. 2 y_max + 1 <= 253)
POLY_MARGIN = 2.0 ** -10   # slack kept at every threshold: >> the float32 rounding of the fma


# -- the GPU compress kernel's code search (gpu/lynx_compress.py ``_codes``) ----------------------
#
# The end cells (lynx_tables.py) split each of their codes I at y = I, so the search counts the
# half-step thresholds H_j, j = 1 .. 2 y_max, at y = j / 2: H_2I-1 = thresholds[I - 1] and
# H_2I = levels[I] (sorted; H_0 = 0). F = #{j >= 1 : H_j <= |x|} = 2 I - 1 + h (F = 0: I = 0,
# h = 1), so I = (F + 1) >> 1 and h = [|x| >= levels[I]] = 1 - (F & 1), which is
# lynx_ref.quantize's h = [|x| >= split[I]] wherever split[I] is finite (h = 0 where it is
# +inf: I = 2^(r-1), and the middle cells, which ignore h). An estimate n of 2y (Eq. (3)
# doubled) that is F or F + 1, then one comparison with H_n (entry n of the table), settles F
# exactly. The kernel stores code(F) = (m << r) | (field ^ bias) (lynx_ref's anchor magnitude
# and residual field of that (I, h)), got from entry n one of two ways:
#   * 4 + 4 (the default): v = w + (d >> 30), d = bits(|x|) - the low word (both >= 0), w the
#     estimate's n + 16 in the low bits. The low word is H_n for n <= 2^r (d >> 30: 0, or -1
#     below it) and H_n + 2^30 past it (-1 / -2), so v = F + 16 in cell 0 and F + 15 after;
#     H_2^r is 2.0 (always below), so F = 2^r (split +inf: 2^r - 1's code) never shows: cell 0
#     ends at v = 31 (F = 2^r - 1 or 2^r), cell 1 starts at v = 32. The kernel's ``_pack44``
#     decodes four v at a time from their bits;
#   * else the high word holds code(n) and code(n - 1), at bytes 0 / 3 (n <= 2^r) or 3 / 2
#     (past it), and (d >> 30) & 3 (0, 3; 3, 2) picks the byte with one byte permute.
# Values past 2 y_max and the always-below entries compare with 2.0: every comparison stays
# within 2^30 of |x| <= 1, which (d >> 30) needs. Computing the field from (I, h) per value
# instead (an end-cell test, 2 d + 1 - h, the exception at I = 2^(r-1)) or loading split[I]
# after the search costs ~8 integer ops a value, 8-byte entries for every value twice the
# shared-memory wavefronts of the lookup (H200 compress: 0.72x and 0.85x of the old search).


def _half_steps(alpha: float, y_max: int) -> np.ndarray:
    """float32 [2 y_max + 1]: H_0 = 0, then the thresholds interleaved with levels[1 ..]."""
    thr = lynx_tables.thresholds(alpha, y_max).numpy()
    lv = lynx_tables.levels(alpha, y_max).numpy()
    h = np.zeros(2 * y_max + 1, dtype=np.float32)
    h[1::2], h[2::2] = thr, lv[1:]
    if not np.all(np.diff(h) > 0):
        raise ValueError(f"alpha={alpha}: the half-step thresholds are not increasing in float32")
    return h


def code_bytes(alpha: float, y_max: int, residual_bits: int) -> np.ndarray:
    """int64 [2 y_max + 1]: code(F) = (m << r) | (field ^ bias) of each half-step count F: the
    anchor magnitude and the r-bit residual field lynx_ref.quantize gives code I = (F + 1) >> 1
    with split h = 1 - (F & 1) (0 where split[I] is +inf), as the compress kernel stores them."""
    r = residual_bits
    f = np.arange(2 * y_max + 1)
    i = (f + 1) >> 1
    split = lynx_tables.split_thresholds(alpha, y_max, r).numpy()
    h = np.where(np.isfinite(split[i]), 1 - (f & 1), 0)
    bias, top = (1 << (r - 1)) - 1, y_max >> r
    m = (i + bias) >> r
    d = (m << r) - i
    field = np.where((m == 0) | (m == top), 2 * d + 1 - h, d) & ((1 << r) - 1)
    return ((m << r) | (field ^ bias)).astype(np.int64)


def _entries(alpha: float, y_max: int, residual_bits: int) -> np.ndarray:
    if 2 * y_max + 2 > SEARCH_LEN:
        raise ValueError(f"{y_max=} exceeds the {SEARCH_LEN}-entry search table")
    hs = _half_steps(alpha, y_max)
    code = code_bytes(alpha, y_max, residual_bits)
    n = np.arange(SEARCH_LEN)
    t = np.full(SEARCH_LEN, 2.0, dtype=np.float32)
    t[:len(hs)] = hs
    t[1 << residual_bits] = 2.0  # F = 2^r is 2^r - 1's code (split +inf): always below
    late = (n > 1 << residual_bits).astype(np.int64)
    lo = t.view(np.int32).astype(np.int64) + (late << 30)
    top = len(code) - 1
    above, below = code[np.minimum(n, top)], code[np.clip(n - 1, 0, top)]
    hi = np.where(late == 1, above << 24 | below << 16, above | below << 24)
    return lo | hi << 32


@dataclass(frozen=True)
class LogSearch:
    """The GPU compress kernel's code search: Eq. (3) doubled, evaluated once, approximately,
    then one exact comparison with one table entry (the grid above):

        a = min(|x|, 1.0)
        n = round(scale * log2(fma(a, alpha, 1)))     (scale = 2 y_max / log2(1 + alpha);
                                                        = bits(. + MAGIC) - bits(MAGIC), one fma)
        F = n - [a < H_n]                             (entries[n]: H_n, code(n), code(n - 1))

    z = scale * log2(1 + alpha * a) = 2y lies in [F, F + 1) (to the thresholds' float32
    rounding), so round(z') is F or F + 1 where the float32 z' is within err < 1/2 of z.
    ``err`` bounds every error: the float32 log2 within 2**-21 absolute (the GPU's lg2.approx
    included), the rounding of p, alpha, scale and the thresholds. No bias is needed: the
    rounding to nearest of z' is the same fma as the product.
    """

    alpha: float
    scale: float
    entries: np.ndarray   # int64 [SEARCH_LEN]: threshold word | code bytes << 32 (above)


@functools.lru_cache(maxsize=64)
def log_search(alpha: float, y_max: int, residual_bits: int) -> LogSearch:
    f32 = np.float32
    scale = float(f32(2 * y_max / np.log2(1.0 + alpha)))
    err = scale * 2.0 ** -20 + 2.0 ** -16
    if err >= 0.5 - POLY_MARGIN:
        raise ValueError(f"alpha={alpha} is too small for the log-search code lookup "
                         f"(scale {scale:.3g}: float32 log2 cannot place 2y within 1/2)")
    return LogSearch(float(f32(alpha)), scale, _entries(alpha, y_max, residual_bits))



@dataclass(frozen=True)
class PolySearch:
    """A quadratic in place of Eq. (3)'s log2 in the GPU compress search, for alphas small
    enough that the alpha-law is nearly linear (the defaults):

        n = round(P(a)),  or if ``floor``: floor(P(a)) + 1     P(a) = fma(fma(a, c2, c1), a, 0)
                          (one rounding with MAGIC: to nearest, or toward -inf with MAGIC + 1)
        F, byte: LogSearch's, from entries[n]

    n is F or F + 1 for every a in [0, 1] when P is increasing on [0, 1] and P(H_j) lies in
    [j - s - 1/2, j - s + 1/2] for every half-step threshold H_j, s = 1/2 if ``floor`` else 0
    (then between H_j and H_j+1, P + 1/2 + s is in [j, j + 2)); ``poly_search`` checks that,
    with POLY_MARGIN to spare, on the float32 coefficients. P(0) = 0: centred on 2y (to
    nearest) the quadratic fits small alphas with room, alpha 0.5 only narrowly up to
    y_max = 112; centred on 2y - 1/2 (floor), where the first thresholds leave little room, it
    fits alpha 0.5 at every split. ``poly_search`` keeps the wider margin. Two fmas instead of
    fma, lg2 (MUFU) and fma."""

    c1: float
    c2: float
    floor: bool


@functools.lru_cache(maxsize=64)
def poly_search(alpha: float, y_max: int) -> PolySearch | None:
    """The quadratic of ``PolySearch`` for (alpha, y_max), or None where no quadratic keeps
    every half-step threshold within its window (large alphas: the log search then)."""
    thr = _half_steps(alpha, y_max)[1:].astype(np.float64)
    j = np.arange(1, len(thr) + 1, dtype=np.float64)
    a = np.stack([thr, thr * thr], 1)
    best, found = POLY_MARGIN, None
    for floor in (False, True):
        want = j - (0.5 if floor else 0.0)
        w = np.ones_like(j)
        for _ in range(100):  # Lawson: least squares reweighted towards the minimax fit
            c, *_ = np.linalg.lstsq(a * w[:, None], want * w, rcond=None)
            w = w * np.sqrt(np.abs(a @ c - want)) + 1e-12
            w /= w.max()
        c1, c2 = (float(np.float32(v)) for v in c)
        margin = 0.5 - float(np.max(np.abs(c1 * thr + c2 * thr * thr - want)))
        if (c1 > 0 and c1 + 2 * c2 > 0                       # increasing on [0, 1]
                and abs(c1) + abs(c2) < 2.0 ** 10              # fma rounding << POLY_MARGIN
                and margin >= best):                           # (H_2ymax = 1: P(1) too)
            best, found = margin, PolySearch(c1, c2, floor)
    return found


def codes_via_poly_search(x_abs: torch.Tensor, poly: PolySearch,
                          s: LogSearch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Triton compress kernel's quadratic search in torch (tests): |x| -> (F, code byte,
    v) int64 (``_settle``), the inner fma rounded once (through float64), the outer exactly."""
    a = x_abs.float().clamp(max=1.0)
    r = (a.double() * poly.c2 + poly.c1).float()
    p = r.double() * a.double()  # exact
    n = torch.floor(p) + 1 if poly.floor else torch.round(p)  # round: half to even, as RN
    return _settle(a, n.long(), s)


def codes_via_log_search(x_abs: torch.Tensor, s: LogSearch, log_error: float = 0.0
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Triton compress kernel's search in torch (tests): |x| -> (F, code byte, v) int64
    (``_settle``), each fma rounded once (through float64). ``log_error`` is added to every
    log2, to show that the result does not depend on it (|log_error| <= 2**-21)."""
    a = x_abs.float().clamp(max=1.0)
    p = (a.double() * s.alpha + 1.0).float()
    lg = torch.log2(p).double() + log_error
    return _settle(a, torch.round(lg * s.scale).long(), s)


def _settle(a: torch.Tensor, n: torch.Tensor, s: LogSearch
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the estimate n (F or F + 1), as the kernel: d = bits(a) - the entry's low word;
    the code byte at byte (d >> 30) & 3 of its high word; v = n + 16 + (d >> 30) (the 4 + 4
    path's value: F + 16 in cell 0, F + 15 past it); and F = n - [a below the threshold]."""
    e = torch.from_numpy(s.entries)[n]
    d = a.view(torch.int32).long() - (e & 0xFFFFFFFF)
    q = d >> 30
    byte = (e >> (32 + 8 * (q & 3))) & 255
    late = (e & 0xFFFFFFFF) > 1 << 30  # (H_n + 2^30; 2.0 itself is 2^30)
    return n + q + late.long(), byte, n + 16 + q


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
    int64 [2, SEARCH_LEN] on ``device``."""
    key = ("search", cfg.alpha_k, cfg.alpha_v, cfg.anchor_bits, cfg.v_anchor_bits, str(device))
    hit = _DEVICE_CACHE.get(key)
    if hit is None:
        searches = [log_search(float(cfg.alpha(w)), cfg.y_max(w), cfg.residual_bits(w))
                    for w in "kv"]
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
