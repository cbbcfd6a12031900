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


def test_keeps_the_prior_until_lengths_spread() -> None:
    estimator = PrefillRateEstimator(prior_tokens_per_s=20_000)
    for _ in range(20):
        estimator.observe(1000, 0.05)
    assert estimator.rate == 20_000
    estimator.observe(0, 1.0)
    assert estimator.rate == 20_000
