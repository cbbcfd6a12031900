"""Requests written ahead before they are sent: a killed process's are booked at the next start, once."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spillgate.gateway.accounting import Accountant
from spillgate.gateway.accounting.inflight import InFlight
from tests.support.procs import REPO_ROOT

CHILD = """
import asyncio, sys, time
from spillgate.gateway.accounting import Accountant, LedgerEntry, TenantLimits

BUDGET = TenantLimits(usd_per_day=10.0)


def entry(cost, entry_id=""):
    return LedgerEntry("req", time.time(), "acme", "chat", "frontier", "hosted", 10, 0, 5, cost, cost, "ok", entry_id)


async def main():
    accountant = Accountant(sys.argv[1])
    await accountant.start()
    reserve = lambda: accountant.reserve("acme", BUDGET, tokens=10, worst_case_usd=0.5, hosted=True)
    dispatch = lambda reservation, worst: accountant.dispatched(
        reservation, "req", "acme", "chat", "frontier", "hosted", 10, worst
    )
    cut_off, settled, released = await reserve(), await reserve(), await reserve()
    for reservation in (cut_off, settled, released):
        dispatch(reservation, 0.5)
    accountant.settle_soon(settled, entry(0.1))
    accountant.release_soon(released)
    recorded, unreserved_cut_off, abandoned = (dispatch(None, 0.3) for _ in range(3))
    accountant.record_soon(entry(0.2, entry_id=recorded))
    accountant.abandon(abandoned)
    await asyncio.sleep(0)
    print("ready", flush=True)
    await asyncio.sleep(3600)  # until killed


asyncio.run(main())
"""


def outcomes(ledger: Path) -> list[tuple[str, float]]:
    with sqlite3.connect(ledger) as db:
        return db.execute("SELECT outcome, cost_usd FROM entries ORDER BY cost_usd, outcome").fetchall()


async def test_a_killed_process_s_unfinished_requests_are_booked_once_by_the_next_start(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(ledger)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        # A second process sharing the directory leaves a running one's requests alone.
        other = Accountant(ledger)
        await other.start()
        await other.stop()
        assert ("gateway_killed", 0.3) not in outcomes(ledger) and ("gateway_killed", 0.5) not in outcomes(ledger)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)

    for _ in range(2):  # the second start books nothing again
        accountant = Accountant(ledger)
        await accountant.start()
        spend = await accountant.spend("acme", now=time.time())
        await accountant.stop()
        assert outcomes(ledger) == [("ok", 0.1), ("ok", 0.2), ("gateway_killed", 0.3), ("gateway_killed", 0.5)]
        assert spend.today.total.requests == 4 and spend.today.total.usd == pytest.approx(1.1)
        assert spend.today.by_kind["hosted"].usd == pytest.approx(1.1)
    assert not list(tmp_path.glob("*.inflight")), "a clean stop with nothing in flight leaves no file"


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.inflight"))


async def test_compaction_keeps_only_the_requests_still_open(tmp_path: Path) -> None:
    inflight = InFlight(tmp_path, "ledger")
    assert inflight.recover() == []
    for entry_id in ("ended", "refused", "streaming"):
        inflight.open((entry_id, 1.0))
    inflight.close("ended")
    inflight.abandon("refused")
    assert len(segments(tmp_path)) == 1
    await inflight.compact()
    (segment,) = segments(tmp_path)
    assert segment.read_bytes() == b'["streaming",1.0]\n'
    await inflight.compact()  # nothing changed: nothing written
    assert segments(tmp_path) == [segment]
    inflight.close_file()
    assert segments(tmp_path) == [segment], "a stream still open at a stop is booked by the next start"

    again = InFlight(tmp_path, "ledger")  # this pid's earlier segments count as an earlier process's
    assert again.recover() == [["streaming", 1.0]]
    again.recovered()
    assert segment not in segments(tmp_path)
    again.close_file()
    assert segments(tmp_path) == []
