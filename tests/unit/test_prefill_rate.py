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
