"""Accounting shared through a real Redis: atomic budgets across processes, outages, exact replay.

Run as ``python -m tests.gateway.test_accounting_redis URL PREFIX LEDGER`` it is the worker process of
the concurrency test: it reserves on cue and prints what it was granted.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from spillgate.gateway.accounting import Accountant, LedgerEntry, QuotaExceeded, TenantLimits, make_client
from spillgate.gateway.accounting.limits import next_month_s
from spillgate.gateway.accounting.records import BackendKind
from tests.support.procs import REPO_ROOT, free_port
from tests.support.redis_server import redis_url as private_redis

NOON = datetime(2025, 3, 14, 12, 0, tzinfo=UTC).timestamp()
BUDGET_TENANT, RATE_TENANT = "budgeted", "rated"
DAILY_USD = 1.0
BUDGET = TenantLimits(usd_per_day=DAILY_USD)
RATE = TenantLimits(requests_per_minute=50)


def unique_prefix() -> str:
    return f"test-acct-{os.getpid()}-{time.time_ns()}"


def entry(tenant: str = "acme", *, cost: float, kind: BackendKind = "replica", at: float = NOON) -> LedgerEntry:
    return LedgerEntry("req", at, tenant, "chat", "frontier" if kind == "hosted" else "llama-0", kind, 100, 0, 20, cost)


async def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def drop_keys(redis_url: str, prefix: str) -> None:
    """Leave a shared ``REDIS_URL`` as it was."""
    with redis.Redis.from_url(redis_url) as client:
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)


@pytest.fixture
async def shared(redis_url: str, tmp_path: Path) -> AsyncIterator[Accountant]:
    client = make_client(redis_url)
    prefix = unique_prefix()
    accountant = Accountant(tmp_path / "ledger.sqlite3", redis=client, key_prefix=prefix)
    await accountant.start(now=NOON)
    yield accountant
    await accountant.stop()
    await client.aclose()
    drop_keys(redis_url, prefix)


async def test_settle_and_release_replace_holds_in_redis(shared: Accountant, redis_url: str, tmp_path: Path) -> None:
    limits = TenantLimits(usd_per_day=1.0, tokens_per_minute=1000)
    first = await shared.reserve("acme", limits, tokens=600, worst_case_usd=0.6, hosted=False, now=NOON)
    assert first.shared
    with pytest.raises(QuotaExceeded) as refused:
        await shared.reserve("acme", limits, tokens=100, worst_case_usd=0.6, hosted=False, now=NOON)
    assert (refused.value.limit, refused.value.retry_after_s) == ("usd_per_day", 43_200)
    assert (await shared.spend("acme", limits, now=NOON)).today.held_usd == pytest.approx(0.6)

    await shared.settle(first, entry(cost=0.1))  # 120 tokens used: 480 of the 600 come back
    second = await shared.reserve("acme", limits, tokens=800, worst_case_usd=0.6, hosted=False, now=NOON)
    await shared.release(second, now=NOON)

    # Another process (its own client and file) sees the same shared state.
    client = make_client(redis_url)
    assert shared.shared is not None
    other = Accountant(tmp_path / "other.sqlite3", redis=client, key_prefix=shared.shared.keys.prefix)
    await other.start(now=NOON)
    try:
        report = await other.spend("acme", limits, now=NOON)
        assert report.today.total.usd == pytest.approx(0.1) and report.today.held_usd == 0
        assert report.rate.tokens_used == pytest.approx(120)
        assert report.month.by_backend["llama-0"].requests == 1
        assert await other.tenants() == {"acme"}
        series = await other.series("acme", hours=1, bucket_s=600, now=NOON + 1)
        assert len(series) == 2 * 7  # 11:00 .. 12:00, both kinds
        assert [(p.start, p.kind, round(p.usd, 6)) for p in series if p.requests] == [(NOON, "replica", 0.1)]
        await other.reserve("acme", limits, tokens=10, worst_case_usd=0.9, hosted=False, now=NOON)
    finally:
        await other.stop()
        await client.aclose()


async def test_counted_ids_are_kept_per_ten_minute_slot_for_hours_not_days(shared: Accountant, redis_url: str) -> None:
    await shared.record(entry(cost=0.1, at=NOON + 599))
    await shared.record(entry(cost=0.1, at=NOON + 600))
    assert shared.shared is not None
    with redis.Redis.from_url(redis_url) as client:
        keys = sorted(k.decode() for k in client.scan_iter(f"{shared.shared.keys.prefix}:*:ids:*"))
        assert [key.rsplit(":", 1)[1] for key in keys] == ["202503141200", "202503141210"]
        assert all(0 < client.ttl(key) <= 2 * 3600 for key in keys)


async def test_redis_refusals_carry_the_same_retry_after_as_in_process(shared: Accountant) -> None:
    async def refused(limits: TenantLimits, tokens: int = 1, usd: float = 0.0) -> QuotaExceeded:
        with pytest.raises(QuotaExceeded) as caught:
            await shared.reserve("acme", limits, tokens=tokens, worst_case_usd=usd, hosted=True, now=NOON)
        return caught.value

    rpm = TenantLimits(requests_per_minute=3)
    for _ in range(3):
        await shared.reserve("acme", rpm, tokens=1, worst_case_usd=0, hosted=False, now=NOON)
    assert (await refused(rpm)).retry_after_s == pytest.approx(20.0)
    assert (await refused(TenantLimits(tokens_per_minute=10), tokens=11)).retry_after_s is None
    monthly = TenantLimits(hosted_usd_per_month=0.5)
    await shared.reserve("acme", monthly, tokens=1, worst_case_usd=0.5, hosted=True, now=NOON)
    assert (await refused(monthly, usd=0.01)).retry_after_s == next_month_s(NOON)


async def test_a_hold_whose_process_died_lapses(redis_url: str, tmp_path: Path) -> None:
    client, prefix = make_client(redis_url), unique_prefix()
    accountant = Accountant(tmp_path / "l.sqlite3", redis=client, key_prefix=prefix, hold_ttl_s=60)
    await accountant.start(now=NOON)
    try:
        await accountant.reserve("acme", BUDGET, tokens=1, worst_case_usd=1.0, hosted=False, now=NOON)  # never settled
        with pytest.raises(QuotaExceeded):
            await accountant.reserve("acme", BUDGET, tokens=1, worst_case_usd=0.5, hosted=False, now=NOON + 59)
        await accountant.reserve("acme", BUDGET, tokens=1, worst_case_usd=0.5, hosted=False, now=NOON + 61)
    finally:
        await accountant.stop()
        await client.aclose()
        drop_keys(redis_url, prefix)


async def test_the_hold_of_a_request_in_progress_is_renewed(redis_url: str, tmp_path: Path) -> None:
    """Holds lapse soon after their process stops renewing them, never while their request still runs."""
    client, prefix = make_client(redis_url), unique_prefix()
    accountant = Accountant(
        tmp_path / "l.sqlite3", redis=client, key_prefix=prefix, hold_ttl_s=0.6, replay_interval_s=0.05
    )
    await accountant.start()
    try:
        await accountant.reserve("acme", BUDGET, tokens=1, worst_case_usd=1.0, hosted=False, now=time.time())
        await asyncio.sleep(1.5)  # more than twice the hold's lapse: renewed meanwhile
        with pytest.raises(QuotaExceeded):
            await accountant.reserve("acme", BUDGET, tokens=1, worst_case_usd=0.5, hosted=False, now=time.time())
    finally:
        await accountant.stop()
        await client.aclose()
        drop_keys(redis_url, prefix)


def start_worker(redis_url: str, prefix: str, ledger: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.gateway.test_accounting_redis", redis_url, prefix, str(ledger)]
    worker = subprocess.Popen(command, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
    return worker


def test_two_processes_never_admit_past_a_budget(redis_url: str, tmp_path: Path) -> None:
    """200 concurrent reservations from two processes against $1/day (random worst cases) and 50 rpm."""
    prefix = unique_prefix()
    workers = [start_worker(redis_url, prefix, tmp_path / f"worker{i}.sqlite3") for i in range(2)]
    results = []
    try:
        for worker in workers:  # both are connected and waiting: start them together
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        for worker in workers:
            out, _ = worker.communicate(timeout=60)
            assert worker.returncode == 0
            results.append(json.loads(out))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        drop_keys(redis_url, prefix)
    admitted_costs = [cost for result in results for cost in result["budget"]]
    assert sum(len(result["budget"]) + result["budget_refused"] for result in results) == 200
    assert sum(admitted_costs) <= DAILY_USD + 1e-9  # at most one worst case over: here, none
    assert sum(admitted_costs) > DAILY_USD - 0.05  # and the budget is used, not refused early
    assert sum(result["rate"] for result in results) == RATE.requests_per_minute


async def _worker(redis_url: str, prefix: str, ledger: str) -> None:
    client = make_client(redis_url, timeout_s=5)
    accountant = Accountant(ledger, redis=client, key_prefix=prefix)
    await accountant.start()
    await asyncio.gather(*(client.ping() for _ in range(64)))  # connections open before the race starts
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    costs = [round(random.uniform(0.01, 0.05), 6) for _ in range(100)]

    async def attempt(tenant: str, limits: TenantLimits, cost: float) -> float | None:
        try:
            await accountant.reserve(tenant, limits, tokens=100, worst_case_usd=cost, hosted=False, now=NOON)
        except QuotaExceeded:
            return None
        return cost

    budget = [attempt(BUDGET_TENANT, BUDGET, cost) for cost in costs]
    rate = [attempt(RATE_TENANT, RATE, 0.0) for _ in range(100)]
    outcomes = await asyncio.gather(*budget, *rate)
    granted = [cost for cost in outcomes[:100] if cost is not None]
    print(
        json.dumps(
            {
                "budget": granted,
                "budget_refused": 100 - len(granted),
                "rate": sum(1 for o in outcomes[100:] if o is not None),
            }
        )
    )
    await accountant.stop()
    await client.aclose()


# Outages -------------------------------------------------------------------------------------------------


async def test_an_outage_books_locally_and_replays_each_entry_exactly_once(tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    client = make_client(url)
    ledger = tmp_path / "ledger.sqlite3"
    accountant = Accountant(ledger, redis=client, key_prefix="outage", replay_interval_s=0.05)
    limits = TenantLimits(usd_per_day=10.0)
    try:
        with private_redis(tmp_path, port=port):
            await accountant.start(now=NOON)
            for cost in (0.1, 0.2):
                reservation = await accountant.reserve(
                    "acme", limits, tokens=1, worst_case_usd=1, hosted=False, now=NOON
                )
                await accountant.settle(reservation, entry(cost=cost))
            open_before = await accountant.reserve("acme", limits, tokens=1, worst_case_usd=2, hosted=False, now=NOON)
            released_in_outage = await accountant.reserve(
                "acme", limits, tokens=1, worst_case_usd=3, hosted=False, now=NOON
            )
            assert not accountant.degraded
            await client.save()  # the restarted server reloads this snapshot

        # Redis is gone: requests are still admitted (fail-open) and booked into the local outbox.
        for cost in (0.3, 0.4, 0.5):
            reservation = await accountant.reserve("acme", limits, tokens=1, worst_case_usd=1, hosted=True, now=NOON)
            assert not reservation.shared
            await accountant.settle(reservation, entry(cost=cost, kind="hosted"))
        await accountant.settle(open_before, entry(cost=0.6))
        await accountant.release(released_in_outage, now=NOON)
        assert accountant.degraded
        # The fallback enforces the last shared totals (0.3 spent + 5 held) plus this process's changes since.
        with pytest.raises(QuotaExceeded):
            await accountant.reserve("acme", limits, tokens=1, worst_case_usd=8.5, hosted=False, now=NOON)
        await accountant.release(
            await accountant.reserve("acme", limits, tokens=1, worst_case_usd=7.5, hosted=False, now=NOON), now=NOON
        )
        local_view = await accountant.spend("acme", limits, now=NOON)
        assert local_view.degraded and local_view.today.total.requests == 6

        with private_redis(tmp_path, port=port):
            await wait_for(lambda: not accountant.degraded)
            report = await accountant.spend("acme", limits, now=NOON)
            assert report.today.total.requests == 6
            assert report.today.total.usd == pytest.approx(2.1)
            assert report.today.hosted_usd == pytest.approx(1.2)
            assert report.today.held_usd == 0  # holds settled or released during the outage are gone

            # A replay of everything (as after a crash before the outbox was marked) counts nothing twice.
            with sqlite3.connect(ledger) as db:
                db.execute("UPDATE entries SET shipped = 0")
            await accountant.stop()
            restarted = Accountant(ledger, redis=client, key_prefix="outage")
            await restarted.start(now=NOON)
            assert not restarted.degraded
            with sqlite3.connect(ledger) as db:  # all six were replayed at start, and are marked again
                assert db.execute("SELECT COUNT(*), SUM(shipped) FROM entries").fetchone() == (6, 6)
            report = await restarted.spend("acme", limits, now=NOON)
            assert (report.today.total.requests, round(report.today.total.usd, 6)) == (6, 2.1)
            assert await client.xlen(restarted.shared.keys.stream("acme")) == 6
            # Shared enforcement is back, on totals that include the outage (its scripts reloaded themselves).
            with pytest.raises(QuotaExceeded):
                await restarted.reserve("acme", limits, tokens=1, worst_case_usd=8, hosted=False, now=NOON)
            assert (
                await restarted.reserve("acme", limits, tokens=1, worst_case_usd=7.9, hosted=False, now=NOON)
            ).shared
            await restarted.stop()
    finally:
        await accountant.stop()
        await client.aclose()


async def test_a_redis_restart_with_its_data_is_not_an_outage(tmp_path: Path) -> None:
    """Every pooled connection is dead after the restart; the first call on each reconnects instead of
    switching budgets to this process's counters."""
    port = free_port()
    client = make_client(f"redis://127.0.0.1:{port}/0")
    accountant = Accountant(tmp_path / "ledger.sqlite3", redis=client, key_prefix="restart")
    limits = TenantLimits(usd_per_day=1.0)
    try:
        with private_redis(tmp_path, port=port):
            await accountant.start(now=NOON)
            await asyncio.gather(*(client.ping() for _ in range(8)))  # several pooled connections
            held = await accountant.reserve("acme", limits, tokens=1, worst_case_usd=0.25, hosted=False, now=NOON)
            await accountant.settle(held, entry(cost=0.25))
            await client.save()
        with private_redis(tmp_path, port=port):
            reservations = await asyncio.gather(
                *(
                    accountant.reserve("acme", limits, tokens=1, worst_case_usd=0.1, hosted=False, now=NOON)
                    for _ in range(8)
                ),
                return_exceptions=True,
            )
            assert not accountant.degraded
            granted = [r for r in reservations if not isinstance(r, BaseException)]
            assert len(granted) == 7 and all(r.shared for r in granted)  # 0.25 + 7 x 0.1 <= 1.0 < 0.25 + 0.8
    finally:
        await accountant.stop()
        await client.aclose()


async def test_while_redis_is_away_each_process_spends_only_its_share(tmp_path: Path) -> None:
    port = free_port()
    client = make_client(f"redis://127.0.0.1:{port}/0")
    accountant = Accountant(tmp_path / "ledger.sqlite3", redis=client, key_prefix="share")
    assert accountant.shared is not None
    accountant.shared.processes = lambda: 2  # this process and one peer
    limits = TenantLimits(usd_per_day=1.0)
    try:
        with private_redis(tmp_path, port=port):
            await accountant.start(now=NOON)
            held = await accountant.reserve("acme", limits, tokens=1, worst_case_usd=0.4, hosted=False, now=NOON)
            await accountant.settle(held, entry(cost=0.4))
            await accountant.reserve("acme", limits, tokens=1, worst_case_usd=0.0, hosted=False, now=NOON)
        # Redis is gone. 0.6 was left: this process may spend half of it, the peer the other half.
        granted = 0
        for _ in range(10):
            try:
                await accountant.reserve("acme", limits, tokens=1, worst_case_usd=0.05, hosted=False, now=NOON)
            except QuotaExceeded:
                continue
            granted += 1
        assert accountant.degraded
        assert granted == 6  # 6 x 0.05 = 0.3
        # A budgeted tenant whose shared spend this process never saw is refused, not given a fresh counter.
        with pytest.raises(QuotaExceeded) as refused:
            await accountant.reserve("newcomer", limits, tokens=1, worst_case_usd=0.01, hosted=False, now=NOON)
        assert refused.value.limit == "accounting_unavailable"
        await accountant.reserve("newcomer", TenantLimits(), tokens=1, worst_case_usd=0.01, hosted=False, now=NOON)
    finally:
        await accountant.stop()
        await client.aclose()


async def test_redis_back_empty_gets_every_process_totals_back(tmp_path: Path) -> None:
    """A restart without its data: each process adds the entries Redis had counted from its own ledger
    back (once), so budgets and spend are as before, and the next edit of either is enforced."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    clients = [make_client(url), make_client(url)]
    accountants = [
        Accountant(
            tmp_path / f"ledger{i}.sqlite3", redis=c, key_prefix="empty", replay_interval_s=0.05, epoch_check_s=0.1
        )
        for i, c in enumerate(clients)
    ]
    limits = TenantLimits(usd_per_day=1.0)
    now = time.time()
    try:
        with private_redis(tmp_path, port=port):
            for accountant, cost in zip(accountants, (0.3, 0.4), strict=True):
                await accountant.start(now=now)
                for _ in range(2):
                    held = await accountant.reserve(
                        "acme", limits, tokens=1, worst_case_usd=cost, hosted=False, now=now
                    )
                    await accountant.settle(held, entry(cost=cost / 2, at=now))
                await accountant.flush()
            await wait_for(lambda: all(a.ledger.backlog == 0 for a in accountants))
        with private_redis(tmp_path, port=port):  # back, empty

            async def spent() -> float:
                return (await accountants[0].spend("acme", limits, now=now)).today.total.usd

            deadline = time.monotonic() + 10
            while round(await spent(), 6) != 0.7:
                assert time.monotonic() < deadline, await spent()
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # several more checks by both: nothing is added twice
            assert round(await spent(), 6) == 0.7
            with pytest.raises(QuotaExceeded):
                await accountants[1].reserve("acme", limits, tokens=1, worst_case_usd=0.35, hosted=False, now=now)
            granted = await accountants[1].reserve("acme", limits, tokens=1, worst_case_usd=0.25, hosted=False, now=now)
            assert granted.shared
    finally:
        for accountant, client in zip(accountants, clients, strict=True):
            await accountant.stop()
            await client.aclose()


async def test_fail_closed_refuses_budgeted_tenants_while_redis_is_away(tmp_path: Path) -> None:
    client = make_client(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    accountant = Accountant(tmp_path / "ledger.sqlite3", redis=client, fail_open=False)
    await accountant.start(now=NOON)
    try:
        with pytest.raises(QuotaExceeded) as refused:
            await accountant.reserve("acme", BUDGET, tokens=1, worst_case_usd=0.1, hosted=False, now=NOON)
        assert refused.value.limit == "accounting_unavailable" and refused.value.retry_after_s
        assert accountant.degraded
        rated = TenantLimits(requests_per_minute=2)  # rate limits alone are still enforced locally
        for _ in range(2):
            await accountant.reserve("acme", rated, tokens=1, worst_case_usd=0.1, hosted=False, now=NOON)
        with pytest.raises(QuotaExceeded, match="Rate limit"):
            await accountant.reserve("acme", rated, tokens=1, worst_case_usd=0.1, hosted=False, now=NOON)
        free = await accountant.reserve("acme", TenantLimits(), tokens=1, worst_case_usd=0.1, hosted=False, now=NOON)
        await accountant.settle(free, entry(cost=0.1))
        assert (await accountant.spend("acme", now=NOON)).today.total.usd == pytest.approx(0.1)
    finally:
        await accountant.stop()
        await client.aclose()


if __name__ == "__main__":
    asyncio.run(_worker(*sys.argv[1:4]))
