"""The outlier breaker's transitions and the retry budget, with the time passed in."""

from __future__ import annotations

from spillgate.backends.outlier import Breaker, OutlierRules
from spillgate.gateway.dispatch.retry_budget import RetryBudget

RULES = OutlierRules(consecutive_failures=3, base_ejection_s=10, max_ejection_s=60, max_ejected_percent=50)


def fail(breaker: Breaker, now: float, times: int = 1) -> bool:
    return any([breaker.failed(RULES, now, "boom", may_eject=True) for _ in range(times)])


def test_failures_in_a_row_eject_and_a_success_between_them_resets_the_count() -> None:
    breaker = Breaker()
    assert not fail(breaker, 0.0, 2)
    breaker.succeeded()
    assert not fail(breaker, 0.0, 2)
    assert fail(breaker, 0.0)
    assert breaker.shown(5.0) == "ejected" and breaker.ejected_until == 10.0


def test_after_the_period_one_trial_goes_and_its_verdict_decides() -> None:
    breaker = Breaker()
    fail(breaker, 0.0, 3)
    assert breaker.shown(10.0) == "half_open"
    assert breaker.dispatched(10.0), "the first request after the period is the trial"
    assert not breaker.dispatched(10.0) and breaker.ejected_until == float("inf"), "nothing else while it runs"
    assert fail(breaker, 11.0), "a failed trial ejects again at once"
    assert breaker.ejected_until == 11.0 + 20.0, "for twice as long"
    assert breaker.dispatched(31.0)
    breaker.succeeded()
    assert breaker.shown(31.0) == "closed" and breaker.ejected_until == 0.0


def test_an_abandoned_trial_lets_the_next_request_try() -> None:
    breaker = Breaker()
    fail(breaker, 0.0, 3)
    assert breaker.dispatched(10.0)
    breaker.abandoned()
    assert breaker.dispatched(10.5)


def test_the_backoff_is_capped_and_starts_again_after_a_long_good_spell() -> None:
    breaker = Breaker()
    now, periods = 0.0, []
    for _ in range(5):
        fail(breaker, now, 3)
        periods.append(breaker.ejected_until - breaker.ejected_at)
        now = breaker.ejected_until
        assert breaker.dispatched(now)
    assert periods == [10, 20, 40, 60, 60]
    breaker.succeeded()
    fail(breaker, now + 1000, 3)
    assert breaker.ejected_until - breaker.ejected_at == 10.0


def test_a_pool_keeps_its_allowed_share() -> None:
    assert not RULES.may_eject(pool_size=1, ejected_in_pool=0), "a pool of one keeps its replica"
    assert RULES.may_eject(pool_size=2, ejected_in_pool=0)
    assert not RULES.may_eject(pool_size=2, ejected_in_pool=1)
    breaker = Breaker()
    assert not any(breaker.failed(RULES, 0.0, "boom", may_eject=False) for _ in range(5))
    assert breaker.shown(0.0) == "closed" and breaker.consecutive == 5


def test_the_retry_budget_is_a_share_of_requests_plus_a_floor() -> None:
    budget = RetryBudget(ratio=0.5, min_per_s=0.2, window_s=10)  # a floor of 2 retries per window
    assert budget.try_retry(0.0) and budget.try_retry(0.1)
    assert not budget.try_retry(0.2)
    for _ in range(4):
        budget.request(0.3)
    assert budget.try_retry(0.4) and budget.try_retry(0.5) and not budget.try_retry(0.6)
    assert budget.try_retry(11.0), "the window moved on"
