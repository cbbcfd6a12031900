"""Tenants through the real gateway: rotated keys, rate limits and budgets under concurrency and across
two processes, hosted budgets, scoped spend reads, and a ledger that survives restarts and Redis outages."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.support.gateway import start_gateway, start_replica
from tests.support.procs import RunningProcess, free_port
from tests.support.redis_server import redis_url as private_redis

OLD_KEY, NEW_KEY = "sk-acme-2025", "sk-acme-2026"
LIMITED_KEY = "sk-limited"
BUDGET_KEY = "sk-budget"
OTHER_KEY = "sk-other"
ADMIN_KEY = "sk-tenants-admin"
OUTPUT_TOKENS = 5
"""Every request asks for exactly this many tokens; the simulator produces exactly that many."""
USD_PER_TOKEN = 1.0
"""The pool's price: $3600/hour over 1 token/s, so a request costs its output tokens in dollars (its prompt,
prefilled at a billion tokens/s, adds nanodollars)."""


def config(replica: RunningProcess, **state: Any) -> dict[str, Any]:
    return {
        "pools": [
            {
                "name": "pool",
                "served_model": "sim-model",
                "replicas": [replica.url],
                "gpu_usd_per_hour": 3600,
                "output_tokens_per_s": 1,
                "prefill_tokens_per_s": 1e9,
            }
        ],
        "routes": [{"name": "chat", "targets": ["pool"], "policy": "least_load"}],
        "tenants": [
            {"name": "acme", "keys": [OLD_KEY, NEW_KEY]},
            {"name": "limited", "keys": [LIMITED_KEY], "limits": {"requests_per_minute": 3}},
            {"name": "budget", "keys": [BUDGET_KEY], "budget": {"usd_per_day": 10 * OUTPUT_TOKENS * USD_PER_TOKEN}},
            {"name": "other", "keys": [OTHER_KEY]},
        ],
        "admin": {"keys": [ADMIN_KEY]},
        "health": {"interval_s": 0.2, "timeout_s": 1.0, "unhealthy_after": 1},
        "state": state,
    }


def ask(gateway: RunningProcess, key: str, **extra: Any) -> httpx.Response:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": OUTPUT_TOKENS, **extra}
    return httpx.post(
        gateway.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=60
    )


def spend(gateway: RunningProcess, key: str, path: str = "/v1/spend", **params: Any) -> dict[str, Any]:
    response = httpx.get(gateway.url + path, headers={"authorization": f"Bearer {key}"}, params=params, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def eventually(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    proc = start_replica(tmp_path_factory.mktemp("tenants-replica"), "--time-scale", "0.01")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def gateway(replica: RunningProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    proc = start_gateway(config(replica), tmp_path_factory.mktemp("tenants"))
    yield proc
    proc.stop()


def test_rotated_keys_are_one_tenant(gateway: RunningProcess) -> None:
    before = spend(gateway, OLD_KEY)["today"]["requests"]
    assert ask(gateway, OLD_KEY).status_code == 200
    assert ask(gateway, NEW_KEY).status_code == 200
    eventually(lambda: spend(gateway, NEW_KEY)["today"]["requests"] == before + 2)
    report = spend(gateway, OLD_KEY)
    assert report["tenant"] == "acme"
    assert report["today"]["by_kind"]["replica"]["usd"] == pytest.approx((before + 2) * OUTPUT_TOKENS)


def test_rate_limit_answers_429_with_retry_after(gateway: RunningProcess) -> None:
    statuses = [ask(gateway, LIMITED_KEY) for _ in range(4)]
    assert [r.status_code for r in statuses] == [200, 200, 200, 429]
    refused = statuses[-1]
    error = refused.json()["error"]
    assert error["code"] == "quota_exceeded" and "3 requests/min" in error["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 60


def test_tenants_read_only_their_own_spend(gateway: RunningProcess) -> None:
    assert ask(gateway, OTHER_KEY).status_code == 200
    eventually(lambda: spend(gateway, OTHER_KEY)["today"]["requests"] >= 1)
    mine = spend(gateway, OTHER_KEY, tenant="acme")  # a tenant parameter is ignored: the key decides
    assert mine["tenant"] == "other"
    forbidden = httpx.get(gateway.url + "/admin/spend", headers={"authorization": f"Bearer {OTHER_KEY}"})
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "admin_key_required"
    assert httpx.get(gateway.url + "/v1/spend").status_code == 401
    everyone = spend(gateway, ADMIN_KEY, "/admin/spend")
    names = {t["tenant"] for t in everyone["tenants"]}
    assert {"acme", "other", "limited", "budget"} <= names
    unknown = httpx.get(
        gateway.url + "/admin/spend", params={"tenant": "nosuch"}, headers={"authorization": f"Bearer {ADMIN_KEY}"}
    )
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "tenant"
    one = spend(gateway, ADMIN_KEY, "/admin/spend", tenant="other")
    assert one["tenant"] == "other" and one["series"], "a per-minute series comes with one tenant's report"


def test_budget_and_rate_limit_hold_under_concurrency_on_two_processes(
    replica: RunningProcess, tmp_path: Path, redis_url: str
) -> None:
    state = {"redis_url": redis_url, "key_prefix": f"budget-{free_port()}"}
    gateways = [start_gateway(config(replica, **state), tmp_path / name) for name in ("one", "two")]
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=50) as pool:
            futures = [pool.submit(ask, gateways[i % 2], BUDGET_KEY) for i in range(200)]
            statuses = [f.result().status_code for f in futures]
        assert set(statuses) <= {200, 429}
        served = statuses.count(200)
        budget = 10 * OUTPUT_TOKENS * USD_PER_TOKEN
        one_request = OUTPUT_TOKENS * USD_PER_TOKEN
        eventually(lambda: spend(gateways[0], BUDGET_KEY)["today"]["requests"] == served)
        spent = spend(gateways[1], BUDGET_KEY)["today"]["usd"]
        assert spent == pytest.approx(served * one_request)
        assert spent <= budget + one_request, "overshoot is at most one request's worst case"
        assert served >= 9, "the budget is used, not refused wholesale"
        with concurrent.futures.ThreadPoolExecutor(max_workers=40) as pool:
            limited = [
                f.result().status_code for f in [pool.submit(ask, gateways[i % 2], LIMITED_KEY) for i in range(40)]
            ]
        assert limited.count(200) == 3, "a rate limit of 3/min admits exactly 3 of 40 concurrent requests"
    finally:
        for proc in gateways:
            proc.stop()


def test_restart_loses_no_ledger_entry(replica: RunningProcess, tmp_path: Path) -> None:
    settings = config(replica, data_dir=str(tmp_path / "data"))
    gateway = start_gateway(settings, tmp_path)
    try:
        for _ in range(7):
            assert ask(gateway, OTHER_KEY).status_code == 200
    finally:
        gateway.stop()  # SIGTERM: the ledger is committed on the way out
    gateway = start_gateway(settings, tmp_path)
    try:
        today = spend(gateway, OTHER_KEY)["today"]
        assert today["requests"] == 7 and today["usd"] == pytest.approx(7 * OUTPUT_TOKENS)
    finally:
        gateway.stop()


def test_redis_outage_keeps_serving_and_loses_no_ledger_entry(replica: RunningProcess, tmp_path: Path) -> None:
    port = free_port()
    state = {"redis_url": f"redis://127.0.0.1:{port}/0", "key_prefix": "outage"}
    with private_redis(tmp_path, port=port) as url:
        gateway = start_gateway(config(replica, **state), tmp_path)
        for _ in range(3):
            assert ask(gateway, OTHER_KEY).status_code == 200
        eventually(lambda: spend(gateway, OTHER_KEY)["today"]["requests"] == 3)
        redis.Redis.from_url(url).save()  # a Redis with persistence: what it had comes back after the outage
    try:
        for _ in range(4):
            assert ask(gateway, OTHER_KEY).status_code == 200, "Redis being away does not stop serving"
        health = httpx.get(gateway.url + "/health").json()
        assert health["status"] == "degraded" and health["accounting"] == "degraded"
        assert 'spillgate_degraded{component="accounting"} 1.0' in httpx.get(gateway.url + "/metrics").text
        with private_redis(tmp_path, port=port):
            eventually(lambda: httpx.get(gateway.url + "/health").json()["status"] == "ok")
            today = spend(gateway, ADMIN_KEY, "/admin/spend", tenant="other")["today"]
            assert today["requests"] == 7, "entries booked during the outage reached Redis, each once"
            assert today["usd"] == pytest.approx(7 * OUTPUT_TOKENS)
    finally:
        gateway.stop()
