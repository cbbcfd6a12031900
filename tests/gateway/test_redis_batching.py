"""Spend booked in Redis in batches, through a real Redis (and a real gateway): a few commands a request, every
entry counted once, nothing lost on the way out, and budgets that still hold across processes.

Run as ``python -m tests.gateway.test_redis_batching URL PREFIX LEDGER`` it is the worker process of the budget
race: on cue it reserves, settles and releases against one budget, and prints what it was granted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from spillgate.gateway.accounting import Accountant, LedgerEntry, QuotaExceeded, TenantLimits, make_client
from spillgate.gateway.accounting.limits import day_tag
from spillgate.gateway.accounting.redis_keys import RedisKeys
from tests.gateway.test_accounting_redis import NOON, drop_keys, entry, unique_prefix
from tests.support.gateway import start_gateway, start_replica
from tests.support.procs import REPO_ROOT, RunningProcess, free_port
from tests.support.redis_server import redis_url as private_redis

TENANT_KEY = "sk-batching"


def commands(url: str, name: str = "") -> int:
    """Commands this Redis has run so far (all clients, every command but the ``INFO`` that asks), or those
    called ``name``."""
    with redis.Redis.from_url(url) as client:
        stats = client.info("commandstats")
    if name:
        return int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
    return sum(int(v["calls"]) for key, v in stats.items() if key != "cmdstat_info")


def rollup(url: str, prefix: str, tenant: str, at: float) -> dict[str, int]:
    with redis.Redis.from_url(url) as client:
        fields = client.hgetall(RedisKeys(prefix).day(tenant, day_tag(at)))
    return {k.decode(): int(v) for k, v in fields.items()}


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[str]:
    """A Redis no other test talks to: its command counts are this test's alone."""
    with private_redis(tmp_path, port=free_port()) as url:
        yield url


@pytest.fixture
async def accountant(redis_url: str, tmp_path: Path) -> AsyncIterator[Accountant]:
    client = make_client(redis_url)
    prefix = unique_prefix()
    accountant = Accountant(tmp_path / "ledger.sqlite3", redis=client, key_prefix=prefix, book_interval_s=30)
    await accountant.start(now=NOON)
    yield accountant
    await accountant.stop()
    await client.aclose()
    drop_keys(redis_url, prefix)


def shared_prefix(accountant: Accountant) -> str:
    assert accountant.shared is not None
    return accountant.shared.keys.prefix


async def test_a_burst_of_settles_costs_redis_a_few_commands_each(own_redis: str, tmp_path: Path) -> None:
    """A tenant with no limit is never reserved in Redis, and 300 settles go in one batch: the rollups are
    written once, each entry costs its id and its stream entry."""
    client = make_client(own_redis)
    accountant = Accountant(tmp_path / "ledger.sqlite3", redis=client, key_prefix="burst")
    await accountant.start(now=NOON)
    try:
        before = commands(own_redis)
        for i in range(300):
            reservation = await accountant.reserve("acme", TenantLimits(), tokens=120, worst_case_usd=0.5, hosted=False)
            assert not reservation.shared, "nothing to enforce: no Redis reservation"
            accountant.settle_soon(reservation, entry(cost=0.001 * (i % 7), at=NOON + i))
    finally:
        await accountant.stop()  # waits for the settles
        await client.aclose()
    used = commands(own_redis) - before
    assert used / 300 <= 3, f"{used} Redis commands for 300 requests"
    totals = rollup(own_redis, "burst", "acme", NOON)
    assert totals["t.n"] == 300 and totals["b:llama-0.n"] == 300
    assert totals["t.usd"] == sum(round(0.001 * (i % 7) * 1e9) for i in range(300))
    assert totals["t.completion"] == 300 * 20


async def test_a_hold_stays_in_redis_until_its_settle_is_sent(accountant: Accountant, redis_url: str) -> None:
    """While a settle waits for its batch, another process sees the request's worst case, never neither it nor
    its cost: the hold is dropped in the same step that counts the entry."""
    budget = TenantLimits(usd_per_day=1.0)
    client = make_client(redis_url)
    other = Accountant(
        Path(accountant.ledger.path).with_name("other.sqlite3"), redis=client, key_prefix=shared_prefix(accountant)
    )
    await other.start(now=NOON)
    try:
        first = await accountant.reserve("acme", budget, tokens=10, worst_case_usd=0.6, hosted=False, now=NOON)
        accountant.settle_soon(first, entry(cost=0.1))
        await asyncio.sleep(0.1)  # the settle waits for its batch (30 s apart here)
        assert accountant.shared is not None and accountant.shared.bookings.waiting == 1
        with pytest.raises(QuotaExceeded):
            await other.reserve("acme", budget, tokens=10, worst_case_usd=0.6, hosted=False, now=NOON)
        report = await accountant.spend("acme", budget, now=NOON)  # sends the batch, then reads
        assert report.today.total.usd == pytest.approx(0.1) and report.today.held_usd == 0
        await other.reserve("acme", budget, tokens=10, worst_case_usd=0.6, hosted=False, now=NOON)
    finally:
        await other.stop()
        await client.aclose()


async def test_stopping_sends_every_waiting_settle(accountant: Accountant, redis_url: str) -> None:
    """A stop (SIGTERM) waits for the batches: every entry is counted in Redis and marked so in the file."""
    for i in range(50):
        reservation = await accountant.reserve("acme", TenantLimits(), tokens=10, worst_case_usd=0.1, hosted=False)
        accountant.settle_soon(reservation, entry(cost=0.01, at=NOON + i))
    assert accountant.shared is not None
    await asyncio.sleep(0)
    assert accountant.shared.bookings.waiting == 50, "they wait for the batch, 30 s apart here"
    prefix = shared_prefix(accountant)
    await accountant.stop()
    assert rollup(redis_url, prefix, "acme", NOON)["t.n"] == 50
    with redis.Redis.from_url(redis_url) as client:
        assert client.xlen(RedisKeys(prefix).stream("acme")) == 50
    with sqlite3.connect(accountant.ledger.path) as db:
        assert db.execute("SELECT COUNT(*), SUM(shipped) FROM entries").fetchone() == (50, 50)


async def test_a_batch_sent_again_counts_each_entry_once(accountant: Accountant, redis_url: str) -> None:
    """A batch whose answer was lost is replayed from the outbox: ids already counted are skipped, also
    within one batch."""
    entries = [entry(cost=0.02, at=NOON + i).with_id(f"entry-{i}") for i in range(20)]
    assert accountant.shared is not None
    accountant.shared.bookings.interval_s = 0.01
    await asyncio.gather(*(accountant.record(e) for e in entries))
    await accountant.shared.replay([(e, "") for e in entries + entries[:5]], NOON + 30)
    totals = rollup(redis_url, shared_prefix(accountant), "acme", NOON)
    assert totals["t.n"] == 20 and totals["t.usd"] == 20 * 20_000_000
    series = await accountant.series("acme", hours=1, bucket_s=3600, now=NOON + 60)
    assert sum(point.requests for point in series) == 20


def start_worker(url: str, prefix: str, ledger: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.gateway.test_redis_batching", url, prefix, str(ledger)]
    worker = subprocess.Popen(command, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
    return worker


BUDGET_USD = 1.0
RACE_REQUESTS = 150


def test_two_processes_settling_in_batches_never_spend_past_a_budget(redis_url: str, tmp_path: Path) -> None:
    """Two processes race 150 requests each against $1/day: each reserves a random worst case, then settles at
    a part of it (or releases it). What they spent never passes the budget, and the budget is used."""
    prefix = unique_prefix()
    workers = [start_worker(redis_url, prefix, tmp_path / f"worker{i}.sqlite3") for i in range(2)]
    results = []
    try:
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        for worker in workers:
            out, _ = worker.communicate(timeout=120)
            assert worker.returncode == 0
            results.append(json.loads(out))
        spent = rollup(redis_url, prefix, "racing", time.time()).get("t.usd", 0) / 1e9
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        drop_keys(redis_url, prefix)
    assert sum(r["settled_usd"] for r in results) == pytest.approx(spent)
    assert spent <= BUDGET_USD + 1e-9, "holds and costs together never pass the budget"
    assert spent > 0.7 * BUDGET_USD, "the budget is used, not refused early"


async def _worker(url: str, prefix: str, ledger: str) -> None:
    client = make_client(url, timeout_s=5)
    accountant = Accountant(ledger, redis=client, key_prefix=prefix)
    await accountant.start()
    await asyncio.gather(*(client.ping() for _ in range(64)))
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    limits = TenantLimits(usd_per_day=BUDGET_USD)
    settled = 0.0

    async def one(i: int) -> bool:
        nonlocal settled
        worst = round(random.uniform(0.01, 0.05), 6)
        await asyncio.sleep(random.uniform(0, 0.2))
        try:
            reservation = await accountant.reserve("racing", limits, tokens=100, worst_case_usd=worst, hosted=False)
        except QuotaExceeded:
            return False
        await asyncio.sleep(random.uniform(0, 0.05))  # the request runs
        if i % 10 == 0:
            accountant.release_soon(reservation)
            return True
        cost = round(worst * random.uniform(0.2, 1.0), 6)
        settled += cost
        booked = LedgerEntry("r", time.time(), "racing", "chat", "llama-0", "replica", 50, 0, 5, cost)
        accountant.settle_soon(reservation, booked)
        return True

    admitted = await asyncio.gather(*(one(i) for i in range(RACE_REQUESTS)))
    await accountant.stop()
    await client.aclose()
    print(json.dumps({"admitted": sum(admitted), "settled_usd": settled}))


# Through a gateway --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    proc = start_replica(tmp_path_factory.mktemp("batching-replica"), "--time-scale", "0.01")
    yield proc
    proc.stop()


def gateway_config(replica: RunningProcess, url: str) -> dict[str, object]:
    return {
        "pools": [
            {
                "name": "pool",
                "served_model": "sim-model",
                "replicas": [replica.url],
                "gpu_usd_per_hour": 3600,
                "output_tokens_per_s": 1,
            }
        ],
        "routes": [{"name": "chat", "targets": ["pool"], "policy": "least_load"}],
        "tenants": [{"name": "batched", "keys": [TENANT_KEY]}],
        "health": {"interval_s": 0.2, "timeout_s": 1.0, "unhealthy_after": 1},
        "state": {"redis_url": url, "key_prefix": "batching"},
    }


def test_a_gateway_books_its_requests_in_batches_and_all_before_it_stops(
    replica: RunningProcess, own_redis: str, tmp_path: Path
) -> None:
    """24 clients at once: their settles share script calls (how many share one depends on the rate, so the
    bound is loose; one call a request was the old way), and a SIGTERM right after the last answer loses none."""
    requests = 240
    gateway = start_gateway(gateway_config(replica, own_redis), tmp_path)
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    headers = {"authorization": f"Bearer {TENANT_KEY}"}
    try:
        with httpx.Client(timeout=60) as warm:
            assert warm.post(gateway.url + "/v1/chat/completions", json=body, headers=headers).status_code == 200
        time.sleep(0.5)
        before = commands(own_redis, "evalsha")

        def ask(_: int) -> int:
            return httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=60).status_code

        with concurrent.futures.ThreadPoolExecutor(max_workers=24) as pool:
            assert set(pool.map(ask, range(requests))) == {200}
        gateway.stop()  # SIGTERM right after the last answer: what waits for a batch is sent on the way out
        calls = commands(own_redis, "evalsha") - before
    finally:
        gateway.stop()
    totals = rollup(own_redis, "batching", "batched", time.time())
    assert totals["t.n"] == requests + 1, "every request is counted in Redis before the gateway exits"
    assert calls <= requests / 2, f"{calls} script calls for {requests} requests"
    ledgers = list(tmp_path.glob("data-*/ledger.sqlite3"))
    assert len(ledgers) == 1
    with sqlite3.connect(ledgers[0]) as db:
        assert db.execute("SELECT COUNT(*), SUM(shipped) FROM entries").fetchone() == (requests + 1, requests + 1)


if __name__ == "__main__":
    asyncio.run(_worker(*sys.argv[1:4]))
