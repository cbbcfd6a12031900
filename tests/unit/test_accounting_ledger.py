"""The embedded accountant on a real SQLite file: durable entries, totals that survive a restart, reports."""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from spillgate.gateway.accounting import Accountant, LedgerEntry, QuotaExceeded, TenantLimits
from spillgate.gateway.accounting.ledger import Ledger
from spillgate.gateway.accounting.records import BackendKind

NOON = datetime(2025, 3, 14, 12, 0, tzinfo=UTC).timestamp()
BUDGET = TenantLimits(usd_per_day=1.0, hosted_usd_per_month=5.0)


def entry(
    tenant: str = "acme",
    *,
    cost: float,
    kind: BackendKind = "replica",
    backend: str = "llama-0",
    at: float = NOON,
    equivalent: float = 0.0,
    outcome: str = "ok",
) -> LedgerEntry:
    return LedgerEntry("req-1", at, tenant, "chat", backend, kind, 100, 40, 20, cost, equivalent, outcome)


@pytest.fixture
async def accountant(tmp_path: Path) -> AsyncIterator[Accountant]:
    accountant = Accountant(tmp_path / "ledger.sqlite3")
    await accountant.start(now=NOON)
    yield accountant
    await accountant.stop()


async def serve(accountant: Accountant, booked: LedgerEntry, *, worst: float = 0.5) -> None:
    reservation = await accountant.reserve(
        booked.tenant, BUDGET, tokens=200, worst_case_usd=worst, hosted=booked.kind == "hosted", now=booked.time
    )
    await accountant.settle(reservation, booked)


def rows(path: Path) -> list[tuple[str, float]]:
    with sqlite3.connect(path) as db:  # a second, independent reader of the file
        return db.execute("SELECT tenant, cost_usd FROM entries ORDER BY cost_usd").fetchall()


async def test_flush_makes_every_entry_durable(accountant: Accountant, tmp_path: Path) -> None:
    for cost in (0.1, 0.2, 0.3):
        await serve(accountant, entry(cost=cost))
    await accountant.flush()
    assert rows(tmp_path / "ledger.sqlite3") == [("acme", 0.1), ("acme", 0.2), ("acme", 0.3)]


async def test_entries_reach_the_file_without_being_asked(accountant: Accountant, tmp_path: Path) -> None:
    reservation = await accountant.reserve("acme", BUDGET, tokens=200, worst_case_usd=0.5, hosted=False, now=NOON)
    accountant.settle_soon(reservation, entry(cost=0.25))  # from synchronous code, e.g. a finally block
    await accountant.record(entry(cost=0.5))
    deadline = time.monotonic() + 10
    while len(rows(tmp_path / "ledger.sqlite3")) < 2:  # the background writer commits on its own
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    assert rows(tmp_path / "ledger.sqlite3") == [("acme", 0.25), ("acme", 0.5)]


async def test_stop_commits_what_was_still_queued(tmp_path: Path) -> None:
    accountant = Accountant(tmp_path / "ledger.sqlite3")
    await accountant.start(now=NOON)
    for index in range(50):
        await accountant.record(entry(cost=0.0001 * index))
    reservation = await accountant.reserve("acme", BUDGET, tokens=1, worst_case_usd=0.5, hosted=False, now=NOON)
    accountant.release_soon(reservation, entry(cost=0.0, outcome="error"))
    await accountant.stop()
    assert len(rows(tmp_path / "ledger.sqlite3")) == 51


async def test_a_restarted_gateway_keeps_its_budgets_and_totals(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    first = Accountant(path)
    await first.start(now=NOON)
    await serve(first, entry(cost=0.7))
    await serve(first, entry(cost=0.2, kind="hosted", backend="frontier", equivalent=0.2), worst=0.3)
    await serve(first, entry(cost=0.5, at=NOON - 86_400))  # yesterday: this month, not today
    before = await first.spend("acme", BUDGET, now=NOON)
    await first.stop()

    second = Accountant(path)
    await second.start(now=NOON)
    try:
        after = await second.spend("acme", BUDGET, now=NOON)
        assert after.today.total == before.today.total
        assert after.today.total.usd == pytest.approx(0.9)
        assert after.month.total.usd == pytest.approx(1.4)
        assert after.today.hosted_usd == pytest.approx(0.2)
        with pytest.raises(QuotaExceeded) as refused:  # 0.9 of 1.0 spent before the restart
            await second.reserve("acme", BUDGET, tokens=10, worst_case_usd=0.2, hosted=False, now=NOON)
        assert refused.value.limit == "usd_per_day"
        await second.reserve("acme", BUDGET, tokens=10, worst_case_usd=0.1, hosted=False, now=NOON)
    finally:
        await second.stop()


async def test_spend_reports_kinds_backends_savings_and_holds(accountant: Accountant) -> None:
    await serve(accountant, entry(cost=0.01, equivalent=0.3))
    await serve(accountant, entry(cost=0.02, backend="llama-1", equivalent=0.4))
    await serve(accountant, entry(cost=0.5, kind="hosted", backend="frontier", equivalent=0.5))
    in_flight = await accountant.reserve("acme", BUDGET, tokens=10, worst_case_usd=0.25, hosted=True, now=NOON)

    report = await accountant.spend("acme", BUDGET, now=NOON)
    today = report.today
    assert today.total.requests == 3 and today.total.usd == pytest.approx(0.53)
    assert today.by_kind["replica"].usd == pytest.approx(0.03)
    assert today.by_kind["replica"].savings_usd == pytest.approx(0.67)
    assert today.hosted_usd == pytest.approx(0.5)
    assert set(today.by_backend) == {"llama-0", "llama-1", "frontier"}
    assert today.by_backend["llama-1"].prompt_tokens == 100
    assert today.held_usd == pytest.approx(0.25)
    assert (today.limit_usd, report.month.hosted_limit_usd) == (1.0, 5.0)
    assert report.degraded is False
    body = report.to_dict()
    assert body["today"]["by_kind"]["hosted"]["usd"] == pytest.approx(0.5)
    assert body["month"]["cached_tokens"] == 120

    await accountant.release(in_flight)
    assert (await accountant.spend("acme", BUDGET, now=NOON)).today.held_usd == 0
    assert [t.tenant for t in await accountant.spend_all({"idle": TenantLimits()}, now=NOON)] == ["acme", "idle"]


async def test_series_sums_spend_per_bucket_and_kind(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    accountant = Accountant(path)
    await accountant.start(now=NOON)
    await accountant.record(entry(cost=0.1, at=NOON - 1500))
    await accountant.record(entry(cost=0.2, at=NOON - 1400))
    await accountant.record(entry(cost=0.4, kind="hosted", backend="frontier", at=NOON - 100))
    await accountant.record(entry(cost=9.0, at=NOON - 7200))  # before the window asked for
    live = await accountant.series("acme", hours=0.5, bucket_s=600, now=NOON)
    await accountant.stop()

    assert [(p.start - NOON, p.kind) for p in live[:2]] == [(-1800, "replica"), (-1800, "hosted")]
    assert [round(p.usd, 6) for p in live] == [0.3, 0.0, 0.0, 0.0, 0.0, 0.4]
    assert [p.requests for p in live] == [2, 0, 0, 0, 0, 1]
    restarted = Accountant(path)
    await restarted.start(now=NOON)
    try:  # the series is rebuilt from the file
        assert await restarted.series("acme", hours=0.5, bucket_s=600, now=NOON) == live
    finally:
        await restarted.stop()


async def test_failed_and_refused_requests_are_booked_without_cost(accountant: Accountant, tmp_path: Path) -> None:
    reservation = await accountant.reserve("acme", BUDGET, tokens=10, worst_case_usd=0.9, hosted=False, now=NOON)
    await accountant.release(reservation, entry(cost=0.0, outcome="error"))
    await accountant.reserve("acme", BUDGET, tokens=10, worst_case_usd=0.9, hosted=False, now=NOON)
    await accountant.flush()
    with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
        assert db.execute("SELECT outcome, entry_id FROM entries").fetchall() == [("error", reservation.id)]


async def test_a_gateway_that_never_restarts_still_prunes_past_retention(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    accountant = Accountant(path, retain_days=1)
    await accountant.start(now=NOON)
    try:
        await accountant.record(entry(cost=0.1, at=NOON))
        await accountant.record(entry(cost=0.2, at=NOON + 0.5 * 86_400))
        await accountant.flush()
        assert len(rows(path)) == 2
        await accountant.record(entry(cost=0.3, at=NOON + 1.5 * 86_400))  # the first is now past retention
        deadline = time.monotonic() + 10
        while rows(path) != [("acme", 0.2), ("acme", 0.3)]:  # the writer prunes on its own, no restart
            assert time.monotonic() < deadline, rows(path)
            await asyncio.sleep(0.02)
    finally:
        await accountant.stop()


def _open_ledger_at_once(path: Path, barrier: Any, results: Any) -> None:
    """One gateway worker's start: open the shared ledger file, then stop."""
    barrier.wait()
    try:
        ledger = Ledger(path)
        asyncio.run(ledger.start(NOON))
        asyncio.run(ledger.stop())
        results.put("ok")
    except Exception as exc:  # reported to the test, which names it
        results.put(repr(exc))


def test_workers_opening_a_new_ledger_file_at_once_all_start(tmp_path: Path) -> None:
    """Workers starting together race to switch a new file to WAL; SQLite refuses one of them at once, without
    waiting, so without a retry some of them failed to start (about one in six such races here)."""
    context = multiprocessing.get_context("fork")
    for attempt in range(12):
        path = tmp_path / f"race-{attempt}" / "ledger.sqlite3"
        barrier, results = context.Barrier(4), context.Queue()
        workers = [context.Process(target=_open_ledger_at_once, args=(path, barrier, results)) for _ in range(4)]
        for worker in workers:
            worker.start()
        outcomes = [results.get(timeout=60) for _ in workers]
        for worker in workers:
            worker.join(timeout=60)
        assert outcomes == ["ok"] * 4, outcomes
        db = sqlite3.connect(path)
        try:
            assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        finally:
            db.close()
