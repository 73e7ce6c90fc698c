"""Percentile bootstrap intervals over prompts, and paired intervals of a difference.

A metric is the mean of per-prompt values, optionally transformed (perplexity = exp of the mean
negative log-likelihood). The interval resamples the prompts with replacement ``resamples``
times (a fixed seed, so a report is reproducible) and takes the ``(1 - level) / 2`` and
``(1 + level) / 2`` quantiles of the resampled metric. The paired interval of a codec against
a baseline applies the *same* resampled prompt sets to both, so the noise shared by the two
(which prompts happen to be easy) cancels; "within noise" means that interval contains 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class BootstrapConfig:
    resamples: int = 2000
    level: float = 0.95
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.resamples, int) or self.resamples < 10:
            raise ValueError(f"resamples must be an int >= 10, got {self.resamples!r}")
        if not 0 < self.level < 1:
            raise ValueError(f"level must be in (0, 1), got {self.level!r}")


@dataclass(frozen=True)
class Interval:
    value: float   # the metric on all prompts
    low: float
    high: float

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high


def _check(values: Sequence[float], what: str) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{what} must be a non-empty list of numbers, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{what} holds a non-finite value")
    return a


def _resampled_means(a: np.ndarray, config: BootstrapConfig) -> np.ndarray:
    rng = np.random.default_rng(config.seed)
    idx = rng.integers(0, a.shape[-1], size=(config.resamples, a.shape[-1]))
    return a[..., idx].mean(axis=-1)  # [..., resamples]


def _quantiles(x: np.ndarray, config: BootstrapConfig) -> tuple[float, float]:
    tail = (1 - config.level) / 2
    low, high = np.quantile(x, [tail, 1 - tail])
    return float(low), float(high)


def interval(values: Sequence[float], transform: Callable[[float], float] | None = None,
             config: BootstrapConfig = BootstrapConfig()) -> Interval:
    """The metric ``transform(mean(values))`` with its bootstrap interval."""
    f = transform or (lambda x: x)
    a = _check(values, "values")
    means = _resampled_means(a, config)
    return Interval(f(float(a.mean())), *_quantiles(np.vectorize(f)(means), config))


def paired_difference(values: Sequence[float], baseline: Sequence[float],
                      transform: Callable[[float], float] | None = None,
                      config: BootstrapConfig = BootstrapConfig()) -> Interval:
    """``metric(values) - metric(baseline)`` over the same prompts (same order), with the
    interval of that difference under resampling of the prompts (both sides together)."""
    f = transform or (lambda x: x)
    a, b = _check(values, "values"), _check(baseline, "baseline")
    if a.shape != b.shape:
        raise ValueError(f"paired values need the same prompts: {a.size} values against "
                         f"{b.size} baseline values")
    means = _resampled_means(np.stack([a, b]), config)
    fv = np.vectorize(f)
    diffs = fv(means[0]) - fv(means[1])
    return Interval(f(float(a.mean())) - f(float(b.mean())), *_quantiles(diffs, config))


def perplexity(mean_nll: float) -> float:
    return math.exp(mean_nll)
