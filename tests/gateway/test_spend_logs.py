"""Per-request spend logs: a thousand real requests through a gateway over a simulated replica, read back page
by page and by filter from ``/admin/spend/logs`` and ``/v1/spend/logs``; OpenAI's ``user`` kept with each; an
older gateway's ledger file served; a killed gateway's streams booked with their ``user``."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.gateway import (
    OTHER_KEY,
    TENANT_KEY,
    gateway_config,
    kill_while_streaming,
    pool_of,
    start_gateway,
    start_replica,
)
from tests.support.procs import RunningProcess

ADMIN_KEY = "sk-test-admin"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
REQUESTS = 1000
KEYS = {"tenant-a": TENANT_KEY, "tenant-b": OTHER_KEY}


@dataclass(frozen=True)
class Sent:
    request_id: str
    tenant: str
    route: str
    user: str | None
    batch: int


@dataclass
class World:
    gateway: RunningProcess
    sent: list[Sent]
    between: float
    """A time after every request of batch 0 was booked and before any of batch 1 was sent."""


def plan(index: int) -> Sent:
    """Request ``index``'s tenant, route and user: every combination occurs, and some send no user."""
    tenant = "tenant-b" if index % 4 == 3 else "tenant-a"
    route = "chat" if tenant == "tenant-a" and index % 2 == 0 else "chat-rr"  # tenant-b may use chat-rr only
    user = None if index % 7 == 0 else f"user-{index % 5}"
    return Sent(f"logs-{index:04d}", tenant, route, user, batch=0 if index < REQUESTS // 2 else 1)


async def send(url: str, requests: list[Sent]) -> None:
    """The requests, 16 at a time, as plain OpenAI chat completions (``chat`` by its alias ``talk``)."""
    limit = asyncio.Semaphore(16)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def one(sent: Sent) -> None:
            body: dict[str, Any] = {
                "model": "talk" if sent.route == "chat" else sent.route,
                "messages": [{"role": "user", "content": f"hello {sent.request_id}"}],
                "max_tokens": 2,
            }
            if sent.user is not None:
                body["user"] = sent.user
            headers = {"authorization": f"Bearer {KEYS[sent.tenant]}", "x-request-id": sent.request_id}
            async with limit:
                response = await client.post("/v1/chat/completions", json=body, headers=headers)
            assert response.status_code == 200, response.text

        await asyncio.gather(*(one(sent) for sent in requests))


def logs(gateway: RunningProcess, headers: dict[str, str], path: str = "/admin/spend/logs", **params: Any) -> Any:
    response = httpx.get(gateway.url + path, params=params, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def every_page(gateway: RunningProcess, headers: dict[str, str], path: str = "/admin/spend/logs", **params: Any):
    """Every row of a listing, following ``next_cursor``; and how many pages it took."""
    rows: list[dict[str, Any]] = []
    pages = 0
    cursor = None
    while True:
        page = logs(gateway, headers, path, **params, **({"cursor": cursor} if cursor else {}))
        pages += 1
        rows += page["data"]
        assert page["has_more"] == (page["next_cursor"] is not None)
        cursor = page["next_cursor"]
        if cursor is None:
            return rows, pages
        assert len(page["data"]) == params.get("limit", 100)


def eventually(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


def config(replica_url: str, **overrides: Any) -> dict[str, Any]:
    made = gateway_config([replica_url], admin={"keys": [ADMIN_KEY]}, **overrides)
    made["routes"][0]["aliases"] = ["talk"]
    return made


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    log_dir = tmp_path_factory.mktemp("spend-logs")
    replica = start_replica(log_dir, "--time-scale", "0.01")
    gateway = start_gateway(config(replica.url), log_dir)
    try:
        sent = [plan(index) for index in range(REQUESTS)]
        started = time.monotonic()
        asyncio.run(send(gateway.url, [s for s in sent if s.batch == 0]))
        eventually(lambda: len(logs(gateway, ADMIN, limit=1000)["data"]) == REQUESTS // 2)
        between = time.time()
        time.sleep(0.05)
        asyncio.run(send(gateway.url, [s for s in sent if s.batch == 1]))
        eventually(lambda: len(logs(gateway, ADMIN, limit=1000)["data"]) == REQUESTS)
        print(f"{REQUESTS} requests sent and booked in {time.monotonic() - started:.1f} s")
        yield World(gateway, sent, between)
    finally:
        gateway.stop()
        replica.stop()


def ids(rows: list[dict[str, Any]]) -> list[str]:
    return [row["request_id"] for row in rows]


def expected(world: World, keep: Callable[[Sent], bool]) -> set[str]:
    return {s.request_id for s in world.sent if keep(s)}


def test_admin_pages_through_a_thousand_requests_newest_first(world: World) -> None:
    rows, pages = every_page(world.gateway, ADMIN, limit=137)
    assert pages == 8 and len(rows) == REQUESTS
    assert set(ids(rows)) == expected(world, lambda s: True), "each request exactly once"
    assert [r["time"] for r in rows] == sorted((r["time"] for r in rows), reverse=True)
    assert ids(logs(world.gateway, ADMIN, limit=1000)["data"]) == ids(rows), "pages join into the one listing"
    first = logs(world.gateway, ADMIN)
    assert len(first["data"]) == 100 and first["has_more"], "100 by default"
    by_id = {s.request_id: s for s in world.sent}
    for row in rows:
        sent = by_id[row["request_id"]]
        assert (row["tenant"], row["route"], row["user"]) == (sent.tenant, sent.route, sent.user)
        assert pool_of(row["backend"]) == "pool" and row["kind"] == "replica" and row["outcome"] == "ok"
        assert row["prompt_tokens"] > 0 and row["completion_tokens"] == 2 and row["cached_tokens"] >= 0
        assert row["cost_usd"] >= 0 and len(row["id"]) == 24


def test_a_page_is_not_shifted_by_requests_booked_meanwhile(world: World) -> None:
    first = logs(world.gateway, ADMIN, limit=10, route="chat-rr")
    asyncio.run(send(world.gateway.url, [Sent("logs-late", "tenant-b", "chat-rr", None, 2)]))
    eventually(lambda: logs(world.gateway, ADMIN, limit=1, route="chat-rr")["data"][0]["request_id"] == "logs-late")
    second = logs(world.gateway, ADMIN, limit=10, route="chat-rr", cursor=first["next_cursor"])
    again = logs(world.gateway, ADMIN, limit=21, route="chat-rr")
    assert ids(again["data"]) == ["logs-late", *ids(first["data"]), *ids(second["data"])]
    world.sent.append(Sent("logs-late", "tenant-b", "chat-rr", None, 2))


def test_filters_by_tenant_route_user_and_time(world: World) -> None:
    gateway = world.gateway
    for tenant in ("tenant-a", "tenant-b"):
        rows, _ = every_page(gateway, ADMIN, tenant=tenant, limit=1000)
        assert set(ids(rows)) == expected(world, lambda s, t=tenant: s.tenant == t)
    for route, asked in (("chat", "chat"), ("chat", "talk"), ("chat-rr", "chat-rr")):
        rows, _ = every_page(gateway, ADMIN, route=asked, limit=1000)
        assert set(ids(rows)) == expected(world, lambda s, r=route: s.route == r), asked
    rows, _ = every_page(gateway, ADMIN, user="user-3", limit=50)
    assert set(ids(rows)) == expected(world, lambda s: s.user == "user-3")
    rows, _ = every_page(gateway, ADMIN, tenant="tenant-a", route="chat", user="user-2", limit=1000)
    assert set(ids(rows)) == expected(world, lambda s: (s.tenant, s.route, s.user) == ("tenant-a", "chat", "user-2"))
    assert logs(gateway, ADMIN, tenant="nobody")["data"] == []

    later, _ = every_page(gateway, ADMIN, since=str(world.between), limit=1000)
    assert set(ids(later)) == expected(world, lambda s: s.batch >= 1)
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(world.between)) + f".{int(world.between % 1 * 1e6):06d}Z"
    earlier, _ = every_page(gateway, ADMIN, until=iso, limit=1000)
    assert set(ids(earlier)) == expected(world, lambda s: s.batch == 0)
    window = logs(gateway, ADMIN, since=str(world.between - 3600), until=str(world.between), limit=1000)["data"]
    assert set(ids(window)) == expected(world, lambda s: s.batch == 0)


def test_a_tenant_reads_only_its_own_requests(world: World) -> None:
    own = {"authorization": f"Bearer {OTHER_KEY}"}
    rows, _ = every_page(world.gateway, own, "/v1/spend/logs", limit=100)
    assert set(ids(rows)) == expected(world, lambda s: s.tenant == "tenant-b")
    asking_for_another, _ = every_page(world.gateway, own, "/v1/spend/logs", tenant="tenant-a", limit=1000)
    assert ids(asking_for_another) == ids(rows), "no parameter names another tenant"
    mine = logs(world.gateway, own, "/v1/spend/logs", user="user-1")["data"]
    assert {r["tenant"] for r in mine} == {"tenant-b"} and {r["user"] for r in mine} == {"user-1"}

    refused = httpx.get(world.gateway.url + "/admin/spend/logs", headers=own)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_key_required"
    for path in ("/admin/spend/logs", "/v1/spend/logs"):
        anonymous = httpx.get(world.gateway.url + path)
        assert anonymous.status_code == 401 and anonymous.json()["error"]["type"] == "authentication_error"
    admin_as_tenant = httpx.get(world.gateway.url + "/v1/spend/logs", headers=ADMIN)
    assert admin_as_tenant.status_code == 401, "an admin key is not a tenant key"


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"since": "yesterday"}, "since"),
        ({"until": "2024-13-45"}, "until"),
        ({"since": "nan"}, "since"),
        ({"since": "-5"}, "since"),
        ({"since": "2000", "until": "1000"}, "since"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "0"}, "limit"),
        ({"limit": "many"}, "limit"),
    ],
)
def test_bad_parameters_are_refused_in_openai_format(world: World, params: dict[str, str], param: str) -> None:
    for path, headers in (("/admin/spend/logs", ADMIN), ("/v1/spend/logs", {"authorization": f"Bearer {TENANT_KEY}"})):
        response = httpx.get(world.gateway.url + path, params=params, headers=headers)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]


def test_user_is_stored_and_returned(world: World) -> None:
    client = openai.OpenAI(base_url=world.gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    answer = client.chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": "who am I"}], max_tokens=2, user="alice@example.com"
    )
    request_id = answer.headers["x-request-id"]
    streamed = client.completions.with_raw_response.create(
        model="chat", prompt="once upon", max_tokens=2, user="bob", stream=True
    )
    assert sum(1 for _ in streamed.parse()) >= 1
    own = {"authorization": f"Bearer {TENANT_KEY}"}
    eventually(lambda: bool(logs(world.gateway, own, "/v1/spend/logs", user="bob")["data"]))
    eventually(lambda: bool(logs(world.gateway, own, "/v1/spend/logs", user="alice@example.com")["data"]))
    (row,) = logs(world.gateway, own, "/v1/spend/logs", user="alice@example.com")["data"]
    assert row["request_id"] == request_id and row["tenant"] == "tenant-a" and row["route"] == "chat"
    (row,) = logs(world.gateway, ADMIN, user="bob")["data"]
    assert row["request_id"] == streamed.headers["x-request-id"]

    for user, message in ((42, "must be a string"), ("x" * 257, "at most 256")):
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2, user=user
            )
        error = refused.value.body
        assert error["param"] == "user" and message in error["message"], error
    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2, user="")
    client.close()


OLD_SCHEMA = """
CREATE TABLE entries (
    entry_id TEXT PRIMARY KEY, request_id TEXT NOT NULL, time REAL NOT NULL, tenant TEXT NOT NULL,
    route TEXT NOT NULL, backend TEXT NOT NULL, kind TEXT NOT NULL, prompt_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, cost_usd REAL NOT NULL,
    hosted_equivalent_usd REAL NOT NULL, outcome TEXT NOT NULL, hold_id TEXT NOT NULL DEFAULT '',
    shipped INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX entries_by_time ON entries (time);
CREATE INDEX entries_outbox ON entries (time) WHERE shipped = 0;
"""


def test_a_ledger_file_of_an_older_gateway_opens_and_serves(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with sqlite3.connect(data_dir / "ledger.sqlite3") as db:
        db.executescript(OLD_SCHEMA)
        db.executemany(
            "INSERT INTO entries VALUES (?, ?, ?, 'tenant-a', 'chat', 'pool-0', 'replica', 10, 0, 3, 0.5, 0.5, 'ok', "
            "'', 1)",
            [(f"old-{i}", f"old-request-{i}", time.time() - 100 + i) for i in range(3)],
        )
    replica = start_replica(tmp_path, "--time-scale", "0.01")
    gateway = start_gateway(config(replica.url, state={"data_dir": str(data_dir)}), tmp_path)
    try:
        old = logs(gateway, ADMIN)["data"]
        assert ids(old) == ["old-request-2", "old-request-1", "old-request-0"]
        assert {r["user"] for r in old} == {None}
        spend = httpx.get(gateway.url + "/v1/spend", headers={"authorization": f"Bearer {TENANT_KEY}"}).json()
        assert spend["month"]["requests"] == 3, "the restart totals read the old rows"
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
        client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2, user="u"
        )
        client.close()
        eventually(lambda: len(logs(gateway, ADMIN)["data"]) == 4)
        assert logs(gateway, ADMIN)["data"][0]["user"] == "u"
    finally:
        gateway.stop()
        replica.stop()
    with sqlite3.connect(data_dir / "ledger.sqlite3") as db:
        indexes = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"entries_by_time", "entries_by_tenant"} <= indexes


class Stream(threading.Thread):
    """One long streamed completion, read until the gateway is killed; ``started`` once tokens flow."""

    def __init__(self, url: str, user: str) -> None:
        super().__init__(daemon=True)
        self.url, self.user = url, user
        self.request_id = ""
        self.started = threading.Event()

    def run(self) -> None:
        body = {
            "model": "chat",
            "messages": [{"role": "user", "content": f"a long story for {self.user}"}],
            "max_tokens": 2000,
            "stream": True,
            "user": self.user,
        }
        headers = {"authorization": f"Bearer {TENANT_KEY}"}
        try:
            with httpx.stream("POST", self.url + "/v1/chat/completions", json=body, headers=headers, timeout=30) as r:
                self.request_id = r.headers["x-request-id"]
                for index, _ in enumerate(r.iter_lines()):
                    if index >= 6:
                        self.started.set()
        except httpx.HTTPError:
            pass  # the gateway was killed mid-stream
        finally:
            self.started.set()


def test_a_killed_gateway_s_streams_are_booked_with_their_user(tmp_path: Path) -> None:
    replica = start_replica(tmp_path, "--time-scale", "1")
    made = config(replica.url, state={"data_dir": str(tmp_path / "data")})
    gateway = start_gateway(made, tmp_path)
    try:
        streams = [Stream(gateway.url, user) for user in ("carol", "dave")]
        kill_while_streaming(gateway, streams)
        gateway = start_gateway(made, tmp_path)
        rows = logs(gateway, ADMIN)["data"]
        booked = {row["request_id"]: (row["user"], row["outcome"]) for row in rows}
        assert booked == {s.request_id: (s.user, "gateway_killed") for s in streams}
    finally:
        gateway.stop()
        replica.stop()
