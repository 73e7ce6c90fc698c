"""Bootstrap intervals on known distributions, and the paired difference."""
import math

import numpy as np
import pytest

from lynx_npu.eval.bootstrap import BootstrapConfig, interval, paired_difference, perplexity


def _normal(n, seed=1):
    return np.random.default_rng(seed).normal(3.0, 1.0, n).tolist()


def test_interval_covers_the_mean_and_narrows_with_n():
    small, large = interval(_normal(100)), interval(_normal(1600))
    for iv in (small, large):
        assert iv.low < 3.0 < iv.high and iv.low < iv.value < iv.high
    # the standard error is 1/sqrt(n): 16x the samples, about 1/4 the width
    assert (large.high - large.low) < 0.4 * (small.high - small.low)
    assert 2 * 1.96 / 40 * 0.8 < large.high - large.low < 2 * 1.96 / 40 * 1.2


def test_a_fixed_seed_gives_the_same_interval():
    values = _normal(50)
    assert interval(values) == interval(values)
    assert interval(values, config=BootstrapConfig(seed=1)) != interval(values)


def test_transform_applies_to_the_mean():
    nll = [1.0, 2.0, 3.0]
    iv = interval(nll, perplexity)
    assert iv.value == pytest.approx(math.exp(2.0))
    assert math.exp(1.0) <= iv.low < iv.value < iv.high <= math.exp(3.0)


def test_paired_difference_of_identical_inputs_is_exactly_zero():
    values = _normal(30)
    for transform in (None, perplexity):
        d = paired_difference(values, list(values), transform)
        assert d.value == 0.0 and d.low == 0.0 and d.high == 0.0 and d.contains(0.0)


def test_paired_difference_sees_a_shift_the_unpaired_intervals_hide():
    base = _normal(40)
    shifted = [x + 0.1 for x in base]  # prompt-to-prompt spread 1, shift 0.1
    a, b = interval(shifted), interval(base)
    assert a.low < b.high  # the two intervals overlap
    d = paired_difference(shifted, base)
    assert d.value == pytest.approx(0.1) and d.low == pytest.approx(0.1) \
        and d.high == pytest.approx(0.1) and not d.contains(0.0)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="non-empty"):
        interval([])
    with pytest.raises(ValueError, match="non-finite"):
        interval([1.0, float("nan")])
    with pytest.raises(ValueError, match="same prompts"):
        paired_difference([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="resamples"):
        BootstrapConfig(resamples=1)
    with pytest.raises(ValueError, match="level"):
        BootstrapConfig(level=1.5)
