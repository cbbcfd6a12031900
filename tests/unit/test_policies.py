"""Baseline policies are pure functions of (request, snapshot)."""

from __future__ import annotations

import pytest

from spillgate.policies.prediction import predicted_ttft
from spillgate.policies.registry import PolicyParamError, build_policy, policy_names
from spillgate.policies.types import BackendState, NoCandidate, RouteRequest, Snapshot


def request(sequence: int = 0) -> RouteRequest:
    return RouteRequest(tenant="t", route="r", prompt_tokens=100, max_tokens=10, stream=False, sequence=sequence)


def snapshot(*loads: int, healthy: tuple[bool, ...] | None = None) -> Snapshot:
    flags = healthy or (True,) * len(loads)
    return Snapshot(tuple(BackendState(f"b{i}", "replica", flags[i], in_flight=load) for i, load in enumerate(loads)))


def test_round_robin_rotates_over_healthy_backends() -> None:
    policy = build_policy("round_robin")
    picks = [policy.decide(request(seq), snapshot(0, 0, 0)).backend for seq in range(6)]
    assert picks == ["b0", "b1", "b2", "b0", "b1", "b2"]
    decision = policy.decide(request(1), snapshot(0, 0, 0, healthy=(True, False, True)))
    assert decision.backend == "b2" and "b1" not in decision.ranked


def test_least_load_prefers_the_idlest_and_ranks_the_rest() -> None:
    decision = build_policy("least_load").decide(request(), snapshot(5, 1, 3))
    assert decision.backend == "b1"
    assert decision.ranked == ("b1", "b2", "b0")
    assert decision.reason == "least_load"


def test_least_load_counts_other_clients_load_the_replica_reports() -> None:
    state = Snapshot(
        (
            BackendState("busy", "replica", in_flight=1, running=13, queued=4, external_load=12),
            BackendState("quiet", "replica", in_flight=2, running=9, external_load=1),
        )
    )
    assert build_policy("least_load").decide(request(), state).backend == "quiet"


def test_least_load_ties_rotate() -> None:
    policy = build_policy("least_load")
    assert {policy.decide(request(seq), snapshot(0, 0, 0)).backend for seq in range(3)} == {"b0", "b1", "b2"}


@pytest.mark.parametrize("name", policy_names())
def test_no_healthy_backend_raises(name: str) -> None:
    with pytest.raises(NoCandidate):
        build_policy(name).decide(request(), snapshot(0, 0, healthy=(False, False)))


def test_unknown_policy_name() -> None:
    with pytest.raises(KeyError):
        build_policy("psychic")


def test_registry_snapshot_maps_every_field() -> None:
    """Each of a backend's values lands in its own field of the snapshot."""
    from spillgate.backends.engines import ReplicaLoad
    from spillgate.backends.load import OwnLoad
    from spillgate.backends.registry import Backend

    backend = Backend(
        "r",
        "replica",
        "http://x",
        "m",
        own=OwnLoad(in_flight=3, pending_prefill_tokens=11),
        prefill_tokens_per_s=5.0,
        max_running=7,
        mean_service_s=0.25,
        max_total_tokens=99,
        tier=1,
        context_window=4096,
        usd_per_mtok_in=0.1,
        usd_per_mtok_out=0.2,
        ttft_s=0.3,
        tpot_s=0.04,
    )
    backend.load = ReplicaLoad(running=4, queued=2, token_usage=0.5, cache_hit_rate=0.75)
    backend.own.outstanding_tokens = 17
    backend.external_load = 5
    backend.prefill.overhead_s = 0.001  # an idle replica's; this one has requests in flight
    backend.prefill.busy_overhead_s = 0.006
    state = backend.state(now=0.0, prefix_tokens=13)
    assert state._asdict() == {
        "name": "r",
        "kind": "replica",
        "healthy": True,
        "in_flight": 3,
        "running": 4,
        "queued": 2,
        "token_usage": 0.5,
        "cache_hit_rate": 0.75,
        "max_total_tokens": 99,
        "prefix_tokens": 13,
        "pending_prefill_tokens": 11,
        "prefill_tokens_per_s": 5.0,
        "max_running": 7,
        "mean_service_s": 0.25,
        "tier": 1,
        "context_window": 4096,
        "ttft_s": 0.3,
        "tpot_s": 0.04,
        "usd_per_mtok_in": 0.1,
        "usd_per_mtok_out": 0.2,
        "outstanding_tokens": 17,
        "prefill_overhead_s": 0.006,
        "external_load": 5,
    }


def test_the_batch_under_way_counts_as_computed_as_time_passes() -> None:
    """A snapshot's pending prefill leaves out what the batch in progress has computed since it started, at the
    learned rate, but never more than that batch."""
    from spillgate.backends.registry import Backend

    backend = Backend("r", "replica", "http://x", "m", prefill_tokens_per_s=20_000)
    backend.own.pending_prefill_tokens = 10_000
    assert backend.state(now=5.0).pending_prefill_tokens == 10_000, "no batch under way"
    backend.own.running_prefill_tokens, backend.own.running_prefill_since = 6_000, 4.75
    assert backend.state(now=5.0).pending_prefill_tokens == 5_000, "0.25 s at 20k tokens/s"
    assert backend.state(now=9.0).pending_prefill_tokens == 4_000, "the batch itself, and no more"


# cache_aware: prefix affinity with a load guard, then predicted TTFT ---------------------------------


def prompt(tokens: int = 2200, sequence: int = 0) -> RouteRequest:
    return RouteRequest(tenant="t", route="r", prompt_tokens=tokens, max_tokens=64, stream=True, sequence=sequence)


def replica(name: str, *, pending: int = 0, prefix: int = 0, in_flight: int = 0) -> BackendState:
    return BackendState(
        name, "replica", in_flight=in_flight, pending_prefill_tokens=pending, prefix_tokens=prefix,
        prefill_tokens_per_s=20000.0,
    )  # fmt: skip


def test_cache_aware_stays_warm_while_the_warm_queue_is_moderately_longer() -> None:
    """Moving would recompute 2k tokens; a cold replica under twice as fast is not worth the cluster's work."""
    snap = Snapshot(
        (replica("warm", pending=3000, prefix=2048, in_flight=30), replica("cold"), replica("cold2", pending=500))
    )
    decision = build_policy("cache_aware").decide(prompt(), snap)
    assert decision.backend == "warm"
    assert decision.reason == "prefix_hit"
    assert set(decision.ranked) == {"warm", "cold", "cold2"}, "every healthy candidate stays a fallback"
    assert decision.ranked[1] == "cold", "the rest in predicted-TTFT order"


def test_cache_aware_moves_when_the_warm_replica_is_several_times_slower() -> None:
    snap = Snapshot((replica("warm", pending=60000, prefix=2048), replica("cold", pending=1000)))
    decision = build_policy("cache_aware").decide(prompt(), snap)
    assert decision.backend == "cold"
    assert decision.reason == "least_ttft"


def test_cache_aware_prefers_the_longest_prefix_among_warm_replicas() -> None:
    """A replica holding only the system prompt is not as good as the one holding the whole conversation."""
    snap = Snapshot((replica("session", pending=3000, prefix=3000), replica("system", prefix=1000), replica("cold")))
    assert build_policy("cache_aware").decide(prompt(4200), snap).backend == "session"


def test_cache_aware_places_cold_prompts_by_pending_prefill() -> None:
    snap = Snapshot((replica("a", pending=5000), replica("b", pending=1000), replica("c", pending=3000)))
    decision = build_policy("cache_aware").decide(prompt(), snap)
    assert decision.backend == "b"
    assert decision.ranked == ("b", "c", "a")


def test_cache_aware_ignores_a_short_shared_prefix() -> None:
    """A chat template's few shared tokens are no reason to queue behind a busy replica."""
    snap = Snapshot((replica("template", pending=8000, prefix=64), replica("idle")))
    assert build_policy("cache_aware").decide(prompt(), snap).backend == "idle"


def test_cache_aware_spreads_a_hot_prefix_when_its_replica_has_no_free_slot() -> None:
    busy = BackendState(
        "warm", "replica", in_flight=12, prefix_tokens=2048, prefill_tokens_per_s=20000.0, max_running=4,
        outstanding_tokens=12 * 256, tpot_s=0.02,
    )  # fmt: skip
    idle = BackendState("cold", "replica", prefill_tokens_per_s=20000.0, max_running=4)
    assert build_policy("cache_aware").decide(prompt(), Snapshot((busy, idle))).backend == "cold"


def test_cache_aware_is_not_moved_by_a_stale_scraped_queue() -> None:
    """The last scrape caught our own request queued there; it has been answered since (nothing in flight):
    the warm replica has a free slot, whatever the scrape said."""
    warm = BackendState(
        "warm", "replica", queued=1, prefix_tokens=2048, prefill_tokens_per_s=1e6, max_running=2,
        mean_service_s=0.15,
    )  # fmt: skip
    cold = BackendState("cold", "replica", prefill_tokens_per_s=1e6, max_running=2)
    decision = build_policy("cache_aware").decide(prompt(), Snapshot((warm, cold)))
    assert (decision.backend, decision.reason) == ("warm", "prefix_hit")


def test_other_clients_load_counts_toward_the_slot_wait() -> None:
    """Requests the scrape showed beyond ours are another client's: they hold slots our count cannot see."""
    alone = BackendState("r", "replica", in_flight=1, max_running=2, mean_service_s=0.2)
    shared = alone._replace(external_load=2)
    assert predicted_ttft(prompt(), alone) == predicted_ttft(prompt(), alone._replace(queued=3))
    assert predicted_ttft(prompt(), shared) == pytest.approx(predicted_ttft(prompt(), alone) + 2 * 0.2 / 2)


def test_cache_aware_settles_new_prefixes_where_fewer_requests_will_come_back() -> None:
    """Equal prefill queues: the replica holding fewer requests (conversations that return) gets the new one."""
    snap = Snapshot((replica("crowded", pending=2000, in_flight=30), replica("quiet", pending=2000, in_flight=10)))
    assert build_policy("cache_aware").decide(prompt(), snap).backend == "quiet"


def test_the_affinity_guard_moves_sooner_when_configured_to() -> None:
    """The warm replica is predicted ~2.8x slower than a cold one: kept at 8x, moved at the default (2x)."""
    snap = Snapshot((replica("warm", pending=6000, prefix=2048), replica("cold")))
    patient = build_policy("cache_aware", {"affinity": {"max_slowdown": 8.0}})
    assert patient.decide(prompt(), snap).backend == "warm"
    assert build_policy("cache_aware").decide(prompt(), snap).backend == "cold"
    assert build_policy("cache_aware", {"affinity": {"min_share": 0.95}}).decide(prompt(), snap).backend == "cold"


@pytest.mark.parametrize(
    ("name", "params", "param"),
    [
        ("least_load", {"affinity": {}}, "affinity"),
        ("round_robin", {"colour": "red"}, "colour"),
        ("cache_aware", {"colour": "red"}, "colour"),
        ("cache_aware", {"affinity": {"slack": 3}}, "affinity.slack"),
        ("cache_aware", {"affinity": {"max_slowdown": 0.5}}, "affinity.max_slowdown"),
        ("cache_aware", {"affinity": {"min_share": "most"}}, "affinity.min_share"),
    ],
)
def test_policies_refuse_settings_they_do_not_take(name: str, params: dict, param: str) -> None:
    with pytest.raises(PolicyParamError) as info:
        build_policy(name, params)
    assert info.value.param == param
    assert param.rsplit(".", 1)[-1] in str(info.value), "the message names the setting"


def test_a_name_is_registered_once() -> None:
    from spillgate.policies.builtin import least_load
    from spillgate.policies.registry import register_policy

    register_policy("least_load", least_load)  # the same factory again: nothing changes
    with pytest.raises(ValueError, match="already registered"):
        register_policy("least_load", lambda params: least_load(params))


def test_cache_aware_rotates_cold_prompts_over_idle_replicas_whose_overheads_differ_by_noise() -> None:
    """One idle replica has a measured 3 ms overhead, its siblings none yet: new prefixes still spread."""
    measured = BackendState("measured", "replica", prefill_tokens_per_s=1e6, prefill_overhead_s=0.003)
    fresh = [BackendState(name, "replica", prefill_tokens_per_s=1e6) for name in ("fresh", "fresh2")]
    snap = Snapshot((measured, *fresh))
    policy = build_policy("cache_aware")
    assert {policy.decide(prompt(3000, n), snap).backend for n in range(3)} == {"measured", "fresh", "fresh2"}
    slow = measured._replace(prefill_overhead_s=0.05)  # a real difference still decides
    assert {policy.decide(prompt(3000, n), Snapshot((slow, *fresh))).backend for n in range(3)} == {"fresh", "fresh2"}
