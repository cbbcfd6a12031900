"""Cache isolation between tenants, against the prefix-cache timing probe.

The threat: tenant B sends a prompt and watches ``cached_tokens`` and its TTFT to learn whether tenant A
sent the same prefix before. With ``salted`` or ``dedicated`` isolation B's observations must be the same
whether or not A did; with ``shared`` they are not, which is why ``shared`` is documented as weaker.
"""

from __future__ import annotations

import random
import string
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.gateway import start_gateway, start_replica
from tests.support.procs import RunningProcess

KEYS = {
    "shared-a": "sk-iso-shared-a",
    "shared-b": "sk-iso-shared-b",
    "salted-a": "sk-iso-salted-a",
    "salted-b": "sk-iso-salted-b",
    "dedicated-a": "sk-iso-dedicated-a",
    "default-a": "sk-iso-default-a",
    "default-b": "sk-iso-default-b",
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    log_dir: Path = tmp_path_factory.mktemp("isolation")
    # Real-speed replicas: a 4k-token cold prefill takes long enough to tell apart from a cache hit.
    shared_replica = start_replica(log_dir, "--time-scale", "1")
    private_replica = start_replica(log_dir, "--time-scale", "1")
    tenants = [
        {"name": name, "keys": [key], "isolation": name.split("-")[0]}
        for name, key in KEYS.items()
        if not name.startswith(("dedicated", "default"))
    ]
    tenants += [{"name": name, "keys": [KEYS[name]]} for name in ("default-a", "default-b")]
    tenants.append(
        {"name": "dedicated-a", "keys": [KEYS["dedicated-a"]], "isolation": "dedicated", "dedicated_pools": ["private"]}
    )
    config = {
        "pools": [
            {"name": "pool", "served_model": "sim-model", "replicas": [shared_replica.url]},
            {"name": "private", "served_model": "sim-model", "replicas": [private_replica.url]},
        ],
        "routes": [{"name": "chat", "targets": ["pool", "private"], "policy": "cache_aware"}],
        "tenants": tenants,
        "health": {"interval_s": 0.2, "timeout_s": 1.0, "unhealthy_after": 1},
    }
    gateway = start_gateway(config, log_dir)
    yield gateway
    for proc in (gateway, private_replica, shared_replica):
        proc.stop()


def prefix() -> str:
    """A long system prompt nobody has sent before."""
    # Letters only: the sim's tokenizer cuts them in 4-letter pieces, so the first random piece already differs.
    codename = "".join(random.choices(string.ascii_lowercase, k=12))
    return f"Confidential merger memo {codename}. " + "The parties agree to the terms set out below. " * 350


def send(gateway: RunningProcess, tenant: str, system: str, **extra: object) -> tuple[int, float, str]:
    """``cached_tokens``, TTFT as the client sees it, and the backend that served."""
    body = {
        "model": "chat",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Summarise."}],
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    started = time.perf_counter()
    ttft = 0.0
    cached = -1
    with httpx.stream(
        "POST",
        gateway.url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {KEYS[tenant]}"},
        timeout=60,
    ) as response:
        assert response.status_code == 200, response.read()
        backend = response.headers["x-spillgate-backend"]
        for line in response.iter_lines():
            if line.startswith("data: {") and not ttft:
                ttft = time.perf_counter() - started
            if '"usage":{' in line.replace(" ", ""):
                cached = httpx.Response(200, content=line[6:]).json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    return cached, ttft, backend


def probe(gateway: RunningProcess, victim: str, prober: str, **extra: object) -> tuple[tuple[int, float], ...]:
    """What ``prober`` observes for a fresh prefix, without and then with ``victim`` having sent it first."""
    send(gateway, prober, prefix(), **extra)  # the prober's own template tokens are cached from now on
    alone = send(gateway, prober, prefix(), **extra)
    system = prefix()
    send(gateway, victim, system)
    after_victim = send(gateway, prober, system, **extra)
    return (alone[0], alone[1]), (after_victim[0], after_victim[1])


def assert_unobservable(observations: tuple[tuple[int, float], ...]) -> None:
    (cached_alone, ttft_alone), (cached_after, ttft_after) = observations
    # Only the chat template's first tokens, which every prompt starts with, may be cached: alike either way.
    assert cached_alone == cached_after < 100, "the prober must find the same (no) cached prefix either way"
    # A hit would cut the 4k-token prefill to almost nothing; without one the two prefills cost alike.
    assert ttft_after > 0.5 * ttft_alone, (ttft_alone, ttft_after)


def test_shared_tenants_can_observe_each_others_prefixes(gateway: RunningProcess) -> None:
    """The documented weakness of ``shared``: same replica, same cache, a visible hit."""
    (cached_alone, _), (cached_after, _) = probe(gateway, "shared-a", "shared-b")
    assert cached_alone < 100
    assert cached_after > 3000


def test_salted_victim_is_unobservable_by_a_shared_prober(gateway: RunningProcess) -> None:
    assert_unobservable(probe(gateway, "salted-a", "shared-b"))


def test_salted_prober_learns_nothing_from_a_shared_victim(gateway: RunningProcess) -> None:
    assert_unobservable(probe(gateway, "shared-a", "salted-b"))


def test_tenants_on_the_default_isolation_are_unobservable_to_each_other(gateway: RunningProcess) -> None:
    assert_unobservable(probe(gateway, "default-a", "default-b"))


def test_salted_tenants_are_unobservable_to_each_other(gateway: RunningProcess) -> None:
    assert_unobservable(probe(gateway, "salted-a", "salted-b"))


def test_a_client_cannot_claim_another_tenants_salt(gateway: RunningProcess) -> None:
    system = prefix()
    send(gateway, "salted-a", system)
    assert send(gateway, "salted-a", system)[0] > 3000, "a salted tenant still shares its own cache"
    for forged in ("salted-a|", "salted-a", ""):
        assert send(gateway, "shared-b", system, cache_salt=forged)[0] < 100
    # A salted tenant's own client cannot opt out of its salt either.
    other = prefix()
    send(gateway, "shared-a", other)
    assert send(gateway, "salted-b", other, cache_salt="")[0] < 100


def test_dedicated_tenant_has_its_replicas_to_itself(gateway: RunningProcess) -> None:
    observations = probe(gateway, "dedicated-a", "shared-b")
    assert_unobservable(observations)
    for _ in range(4):
        assert send(gateway, "dedicated-a", prefix())[2].startswith("private/")
        assert send(gateway, "shared-b", prefix())[2].startswith("pool/")
        assert send(gateway, "salted-b", prefix())[2].startswith("pool/")


def test_dedicated_prober_learns_nothing(gateway: RunningProcess) -> None:
    assert_unobservable(probe(gateway, "shared-a", "dedicated-a"))
