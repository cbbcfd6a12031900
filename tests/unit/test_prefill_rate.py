"""The prefill-rate estimator recovers the slope, not the overhead-biased ratio."""

from __future__ import annotations

import random

from spillgate.backends.prefill_rate import PrefillRateEstimator


def test_recovers_rate_despite_fixed_overhead_and_noise() -> None:
    rng = random.Random(3)
    estimator = PrefillRateEstimator(prior_tokens_per_s=20_000)
    for _ in range(64):
        tokens = rng.randrange(200, 8000)
        estimator.observe(0, tokens, 0.004 + tokens / 50_000 + rng.uniform(-0.0005, 0.0005))
    assert 45_000 < estimator.rate < 55_000


def test_same_length_prompts_learn_the_ratio_after_enough_samples() -> None:
    estimator = PrefillRateEstimator(prior_tokens_per_s=20_000)
    for _ in range(7):
        estimator.observe(0, 10_000, 0.32)
    assert estimator.rate == 20_000, "the prior holds until enough samples exist"
    estimator.observe(0, 10_000, 0.32)
    assert 31_000 < estimator.rate < 31_500, "10,000 tokens in 0.32 s, overhead included"
    estimator.observe(0, 0, 1.0)
    assert 31_000 < estimator.rate < 31_500, "samples without uncached tokens say nothing"


def test_overhead_is_learned_so_short_and_long_prefills_are_both_predicted() -> None:
    rng = random.Random(5)
    estimator = PrefillRateEstimator(prior_tokens_per_s=20_000)
    for _ in range(64):
        tokens = rng.randrange(100, 20_000)  # a short prompt alone, or a long queue ahead of it
        ahead = max(0, tokens - 2_000)
        estimator.observe(ahead, tokens - ahead, 0.010 + tokens / 40_000)
    assert 0.009 < estimator.overhead_s < 0.011
    assert abs(estimator.overhead_s + 135 / estimator.rate - (0.010 + 135 / 40_000)) < 0.0005
    assert abs(estimator.overhead_s + 16_000 / estimator.rate - 0.41) < 0.005


def test_same_size_samples_keep_the_learned_rate_and_refit_the_overhead() -> None:
    estimator = PrefillRateEstimator(prior_tokens_per_s=20_000)
    for tokens in range(1_000, 9_000, 250):
        estimator.observe(0, tokens, 0.005 + tokens / 40_000)
    for _ in range(64):  # then only short hits, slower to their first token than before
        estimator.observe(0, 200, 0.020 + 200 / 40_000)
    # Not the 8,000 tokens/s that 200 tokens in 25 ms would make it: same-size samples say nothing of the rate.
    assert 35_000 < estimator.rate < 50_000
    assert abs(estimator.overhead_s + 200 / estimator.rate - 0.025) < 0.0005


def _queue(rng: random.Random, estimator: PrefillRateEstimator, *, rate: float, relay_s: float, count: int) -> None:
    """A replica prefilling one prompt at a time in arrival order, at ``rate`` tokens/s plus 2 ms a pass, fed
    at ~75% busy; each first token reaches the gateway ``relay_s`` later. The gateway counts every prompt it
    sent and has not seen a first token for as ahead, the one in progress whole (its real error under load)."""
    clock = 0.0
    free_at = 0.0
    last_first_token = 0.0
    in_prefill: list[tuple[float, int]] = []  # (first token seen at, tokens)
    for _ in range(count):
        own = rng.randrange(800, 1300)
        clock += rng.expovariate(1.0 / (1050 / rate / 0.75))
        ahead = sum(tokens for seen, tokens in in_prefill if seen > clock)
        done = max(clock, free_at) + own / rate + 0.002
        free_at = done
        first_token = done + relay_s
        drain = first_token - last_first_token if clock < last_first_token else None
        last_first_token = first_token
        in_prefill.append((first_token, own))
        estimator.observe(ahead, own, first_token - clock, drain)


def test_under_a_queue_the_rate_is_how_fast_it_drains() -> None:
    estimator = PrefillRateEstimator(prior_tokens_per_s=20_000)
    _queue(random.Random(11), estimator, rate=30_000, relay_s=0.001, count=400)
    # Each pass's 2 ms floor is part of draining a queue of ~1,050-token prompts: 1,050 / (0.035 + 0.002).
    assert 27_000 < estimator.rate < 30_000
    # A prompt behind ten others waits for all of them.
    predicted = estimator.overhead_s + 11 * 1050 / estimator.rate
    assert abs(predicted - (11 * (1050 / 30_000 + 0.002) + 0.001)) < 0.04


def test_with_a_queue_the_overhead_comes_from_requests_that_found_none() -> None:
    estimator = PrefillRateEstimator(prior_tokens_per_s=20_000)
    _queue(random.Random(12), estimator, rate=30_000, relay_s=0.006, count=200)
    for tokens in range(200, 2200, 100):  # alone on the replica: the relay and one pass on top of the compute
        estimator.observe(0, tokens, 0.006 + 0.002 + tokens / 30_000)
    alone = estimator.overhead_s + 1000 / estimator.rate
    assert abs(alone - (0.008 + 1000 / 30_000)) < 0.004


def test_other_processes_work_between_two_first_tokens_counts_in_the_drain() -> None:
    # Two gateway processes share a replica draining 40k tokens/s: between two of this process's first tokens
    # it also prefilled the other's 1,000-token prompt. Counting only its own, the rate would halve.
    alone, told = PrefillRateEstimator(20_000), PrefillRateEstimator(20_000)
    for _ in range(16):
        alone.observe(2000, 1000, 0.1, drain_s=0.05)
        told.observe(2000, 1000, 0.1, drain_s=0.05, drained_tokens=2000)
    assert round(alone.rate) == 20_000
    assert round(told.rate) == 40_000


def test_a_replica_decoding_others_has_its_own_overhead() -> None:
    # A hit sent to a replica that is decoding waits for the pass in progress and, under an overlap scheduler,
    # the one formed during it (here 20 ms in all); on an idle one it starts at once. One overhead for both
    # would be wrong both ways.
    estimator = PrefillRateEstimator(prior_tokens_per_s=20_000)
    _queue(random.Random(13), estimator, rate=30_000, relay_s=0.001, count=100)
    for tokens in range(100, 1600, 100):
        estimator.observe(0, tokens, 0.003 + tokens / 30_000)
        estimator.observe(0, tokens, 0.023 + tokens / 30_000, busy=True)
    assert abs(estimator.overhead_s - 0.003) < 0.003
    assert abs(estimator.busy_overhead_s - 0.023) < 0.003


def test_a_couple_of_requests_alone_give_the_overhead_before_the_window_fills() -> None:
    # Under a cold start every early request had something ahead (the overhead fitted from them is ~0);
    # the first hits that find nothing ahead on a decoding replica set it at once, not eight requests later.
    estimator = PrefillRateEstimator(prior_tokens_per_s=20_000)
    _queue(random.Random(14), estimator, rate=30_000, relay_s=0.0, count=40)
    estimator.observe(0, 128, 0.025, busy=True)
    estimator.observe(0, 128, 0.027, busy=True)
    assert abs(estimator.busy_overhead_s + 128 / estimator.rate - 0.026) < 0.001
    assert estimator.overhead_s < 0.005  # the queue's own requests that found it idle


def test_without_idle_samples_the_busy_overhead_stands_in() -> None:
    estimator = PrefillRateEstimator(prior_tokens_per_s=20_000)
    for tokens in range(500, 4500, 500):
        estimator.observe(0, tokens, 0.02 + tokens / 30_000, busy=True)
    assert abs(estimator.busy_overhead_s - 0.02) < 0.001
    assert estimator.overhead_s == estimator.busy_overhead_s
