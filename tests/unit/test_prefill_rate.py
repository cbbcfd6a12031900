"""The prefill-rate estimator recovers the slope, not the overhead-biased ratio."""

from __future__ import annotations

import random

from backends.prefill_rate import PrefillRateEstimator


def test_recovers_rate_despite_fixed_overhead_and_noise() -> None:
    rng = random.Random(3)
    estimator = PrefillRateEstimator(prior_tokens_per_s=20_000)
    for _ in range(64):
        tokens = rng.randrange(200, 8000)
        estimator.observe(tokens, 0.004 + tokens / 50_000 + rng.uniform(-0.0005, 0.0005))
    assert 45_000 < estimator.rate < 55_000


def test_same_length_prompts_learn_the_ratio_after_enough_samples() -> None:
    estimator = PrefillRateEstimator(prior_tokens_per_s=20_000)
    for _ in range(7):
        estimator.observe(10_000, 0.32)
    assert estimator.rate == 20_000, "the prior holds until enough samples exist"
    estimator.observe(10_000, 0.32)
    assert 31_000 < estimator.rate < 31_500, "10,000 tokens in 0.32 s, overhead included"
    estimator.observe(0, 1.0)
    assert 31_000 < estimator.rate < 31_500, "samples without uncached tokens say nothing"


def test_overhead_is_learned_so_short_and_long_prefills_are_both_predicted() -> None:
    rng = random.Random(5)
    estimator = PrefillRateEstimator(prior_tokens_per_s=20_000)
    for _ in range(64):
        tokens = rng.randrange(100, 20_000)  # a short prompt alone, or a long queue ahead of it
        estimator.observe(tokens, 0.010 + tokens / 40_000)
    assert 0.009 < estimator.overhead_s < 0.011
    assert abs(estimator.overhead_s + 135 / estimator.rate - (0.010 + 135 / 40_000)) < 0.0005
    assert abs(estimator.overhead_s + 16_000 / estimator.rate - 0.41) < 0.005


def test_same_size_samples_keep_the_learned_rate_and_refit_the_overhead() -> None:
    estimator = PrefillRateEstimator(prior_tokens_per_s=20_000)
    for tokens in range(1_000, 9_000, 250):
        estimator.observe(tokens, 0.005 + tokens / 40_000)
    for _ in range(64):  # then only short hits, slower to their first token than before
        estimator.observe(200, 0.020 + 200 / 40_000)
    # Not the 8,000 tokens/s that 200 tokens in 25 ms would make it: same-size samples say nothing of the rate.
    assert 35_000 < estimator.rate < 50_000
    assert abs(estimator.overhead_s + 200 / estimator.rate - 0.025) < 0.0005
