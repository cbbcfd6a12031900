"""The ledger's writer: commits run at idle CPU priority, fall back to normal priority when starved, and a
batch's rows reach the file exactly as booked, whatever interrupts the commit."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from spillgate.gateway.accounting import idle_worker
from spillgate.gateway.accounting.idle_worker import IdleWorker
from spillgate.gateway.accounting.ledger import Ledger
from spillgate.gateway.accounting.records import LedgerEntry

NOON = 1_741_953_600.0
linux_only = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")


def _policy() -> tuple[str, int]:
    return threading.current_thread().name, os.sched_getscheduler(0)


@linux_only
async def test_commits_run_on_an_idle_priority_thread() -> None:
    worker = IdleWorker("test")
    try:
        name, policy = await worker.run(_policy)
    finally:
        worker.shutdown()
    assert "idle" in name
    assert policy == os.SCHED_IDLE


@linux_only
async def test_a_starved_commit_sends_the_next_ones_to_normal_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idle_worker, "STARVED_S", 0.01)
    worker = IdleWorker("test")
    try:
        await worker.run(time.sleep, 0.05)  # as long as a commit the loop kept off the core
        name, policy = await worker.run(_policy)
    finally:
        worker.shutdown()
    assert "normal" in name
    assert policy == os.SCHED_OTHER


def _entry(index: int) -> LedgerEntry:
    return LedgerEntry(
        f"req-{index}", NOON + index, "acme", "chat", "llama-0", "replica", 100 + index, 7, 20, 0.25, 0.5, "ok",
        f"id-{index:04d}",
    )  # fmt: skip


async def test_every_field_reaches_the_file_as_booked(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    await ledger.start(NOON)
    try:
        ledger.append(_entry(1), shipped=False, hold_id="hold-1")
        ledger.append(_entry(2), shipped=True)
        await ledger.flush()
        assert await ledger.unshipped(10) == [(_entry(1), "hold-1")]
    finally:
        await ledger.stop()
    with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
        assert db.execute("SELECT entry_id, shipped FROM entries ORDER BY entry_id").fetchall() == [
            ("id-0001", 0),
            ("id-0002", 1),
        ]


async def test_a_commit_interrupted_by_stop_loses_and_doubles_nothing(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    await ledger.start(NOON)
    for index in range(2000):
        ledger.append(_entry(index), shipped=False)
    flushing = asyncio.create_task(ledger.flush())
    await asyncio.sleep(0)  # the batch is on the writer thread
    flushing.cancel()
    for index in range(2000, 2100):
        ledger.append(_entry(index), shipped=False)
    await ledger.stop()  # the cancelled batch went back to the queue: committed again, ignored as a repeat

    restarted = Ledger(tmp_path / "ledger.sqlite3")
    await restarted.start(NOON)
    try:
        assert restarted.backlog == 2100
        with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
            assert db.execute("SELECT COUNT(*), COUNT(DISTINCT entry_id) FROM entries").fetchone() == (2100, 2100)
    finally:
        await restarted.stop()
