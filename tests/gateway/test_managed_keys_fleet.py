"""Managed keys across two real gateway processes sharing one Redis: a key made on one works on the other as soon
as the answer that made it has come back, a revoked one fails on both as soon as the revocation has, and Redis
keeps them across restarts."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.gateway.test_managed_keys import (
    CONFIG_KEY,
    admin,
    chat,
    create,
    keys_config,
    refused_as_unknown,
    status_of,
)
from tests.support.gateway import start_gateway, start_replica
from tests.support.procs import RunningProcess, free_port
from tests.support.redis_server import redis_url as private_redis


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    proc = start_replica(tmp_path_factory.mktemp("fleet-keys-replica"), "--time-scale", "0.01")
    yield proc
    proc.stop()


def fleet_config(replica: RunningProcess, redis_url: str, data_dir: Path, prefix: str) -> dict[str, Any]:
    return keys_config(replica, data_dir, redis_url=redis_url, key_prefix=prefix)


@pytest.fixture
def prefix() -> str:
    """This test's keys in Redis: ``<prefix>:keys:*``."""
    return "keys-" + secrets.token_hex(4)


@pytest.fixture
def fleet(
    replica: RunningProcess, redis_url: str, tmp_path: Path, prefix: str
) -> Iterator[tuple[RunningProcess, RunningProcess]]:
    """Two gateways, each with its own data directory: all they share is Redis."""
    one = start_gateway(fleet_config(replica, redis_url, tmp_path / "one", prefix), tmp_path)
    try:
        two = start_gateway(fleet_config(replica, redis_url, tmp_path / "two", prefix), tmp_path)
        try:
            yield one, two
        finally:
            two.stop()
    finally:
        one.stop()


def test_a_key_made_on_one_process_works_at_once_on_the_other(fleet: tuple[RunningProcess, RunningProcess]) -> None:
    one, two = fleet
    for _ in range(5):
        made = create(one)
        assert chat(two, made["key"])
        assert made["id"] in [k["id"] for k in admin(two, "GET", "/admin/keys").json()["data"]]


def test_a_revoked_key_fails_at_once_on_every_process(fleet: tuple[RunningProcess, RunningProcess]) -> None:
    one, two = fleet
    for _ in range(3):
        made = create(two)
        assert chat(one, made["key"]) and chat(two, made["key"])
        assert admin(one, "DELETE", f"/admin/keys/{made['id']}").status_code == 200
        refused_as_unknown(two, made["key"])
        refused_as_unknown(one, made["key"])
    assert chat(two, CONFIG_KEY)


def test_a_rotation_on_one_process_holds_on_the_other(fleet: tuple[RunningProcess, RunningProcess]) -> None:
    one, two = fleet
    old = create(one)
    assert chat(two, old["key"])
    new = admin(two, "POST", f"/admin/keys/{old['id']}/rotate").json()
    assert chat(one, new["key"])
    refused_as_unknown(one, old["key"])


def test_a_tenant_key_cannot_manage_keys_on_any_process(fleet: tuple[RunningProcess, RunningProcess]) -> None:
    one, two = fleet
    managed = create(one)["key"]
    for gateway in (one, two):
        for key in (CONFIG_KEY, managed):
            assert admin(gateway, "GET", "/admin/keys", key=key).status_code == 403


def test_a_per_key_rate_limit_holds_across_processes(fleet: tuple[RunningProcess, RunningProcess]) -> None:
    one, two = fleet
    limited = create(one, limits={"requests_per_minute": 2})["key"]
    assert status_of(one, limited) == 200
    assert status_of(two, limited) == 200
    assert status_of(one, limited) == 429
    assert status_of(two, limited) == 429
    assert status_of(two, CONFIG_KEY) == 200


def test_redis_keeps_the_keys_across_restarts(replica: RunningProcess, redis_url: str, tmp_path: Path) -> None:
    prefix = "keys-" + secrets.token_hex(4)
    first = start_gateway(fleet_config(replica, redis_url, tmp_path / "first", prefix), tmp_path)
    try:
        kept = create(first)
        gone = create(first)
        admin(first, "DELETE", f"/admin/keys/{gone['id']}")
    finally:
        first.stop()
    # Another data directory: what it knows comes from Redis alone.
    second = start_gateway(fleet_config(replica, redis_url, tmp_path / "second", prefix), tmp_path)
    try:
        assert chat(second, kept["key"])
        refused_as_unknown(second, gone["key"])
    finally:
        second.stop()


def test_an_emptied_redis_gets_the_keys_back_from_the_data_directory(
    replica: RunningProcess, redis_url: str, tmp_path: Path
) -> None:
    """``serve --workers`` without a configured Redis runs a private one that ends with the gateway: the data
    directory's copy brings the keys back into the next one."""
    data = tmp_path / "data"
    first = start_gateway(fleet_config(replica, redis_url, data, "keys-" + secrets.token_hex(4)), tmp_path)
    try:
        kept = create(first)
    finally:
        first.stop()
    second = start_gateway(fleet_config(replica, redis_url, data, "keys-" + secrets.token_hex(4)), tmp_path)
    try:
        assert chat(second, kept["key"])
    finally:
        second.stop()


def eventually(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


@pytest.mark.parametrize("rule", ["fail_open", "fail_closed"])
def test_a_redis_outage_never_answers_500(replica: RunningProcess, tmp_path: Path, rule: str) -> None:
    """Config keys keep working; managed keys follow ``on_redis_outage``: the last known set keeps working
    (fail_open) or every managed key is refused with a 503 until Redis is back (fail_closed)."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    config = keys_config(replica, tmp_path / "data", redis_url=url, key_prefix="outage", on_redis_outage=rule)
    with private_redis(tmp_path, port=port):
        gateway = start_gateway(config, tmp_path)
        made = create(gateway)
        assert chat(gateway, made["key"])
    try:
        assert chat(gateway, CONFIG_KEY)
        down = admin(gateway, "POST", "/admin/keys", json={"tenant": "acme"})
        assert down.status_code == 503 and down.json()["error"]["code"] == "key_store_unavailable"
        if rule == "fail_open":
            assert chat(gateway, made["key"])
        else:
            eventually(lambda: status_of(gateway, made["key"]) == 503)
        assert chat(gateway, CONFIG_KEY)
        with private_redis(tmp_path, port=port):
            eventually(lambda: status_of(gateway, made["key"]) == 200)
            assert chat(gateway, create(gateway)["key"])
    finally:
        gateway.stop()


def test_a_per_key_budget_holds_across_processes(replica: RunningProcess, redis_url: str, tmp_path: Path) -> None:
    """Priced so a request of 5 tokens costs $5: a $12 key budget pays for one request on each process, and
    refuses the third wherever it is sent."""
    prefix = "keys-" + secrets.token_hex(4)
    gateways = []
    try:
        for name in ("one", "two"):
            config = fleet_config(replica, redis_url, tmp_path / name, prefix)
            config["pools"][0] |= {"gpu_usd_per_hour": 3600, "output_tokens_per_s": 1, "prefill_tokens_per_s": 1e9}
            gateways.append(start_gateway(config, tmp_path))
        one, two = gateways
        key = create(one, budget={"usd_per_day": 12})["key"]
        assert status_of(one, key, max_tokens=5) == 200
        assert status_of(two, key, max_tokens=5) == 200
        assert status_of(one, key, max_tokens=5) == 429
        assert status_of(two, key, max_tokens=5) == 429
        assert status_of(two, CONFIG_KEY, max_tokens=5) == 200
    finally:
        for gateway in gateways:
            gateway.stop()


def test_a_change_whose_announcement_was_missed_still_reaches_every_process(
    fleet: tuple[RunningProcess, RunningProcess], redis_url: str, prefix: str
) -> None:
    """A revocation written to Redis without its announcement (as a process whose subscription broke would
    miss it): each process sees the change counter move at its next check and reloads."""
    one, two = fleet
    made = create(one)
    assert chat(two, made["key"])
    client = redis.Redis.from_url(redis_url)
    stored = client.hget(f"{prefix}:keys:records", made["id"])
    assert stored is not None
    record = json.loads(stored)
    client.hset(f"{prefix}:keys:records", made["id"], json.dumps({**record, "revoked_at": time.time()}))
    client.incr(f"{prefix}:keys:epoch")
    for gateway in (one, two):
        eventually(lambda g=gateway: status_of(g, made["key"]) == 401)
