"""Coming back to shared budgets: the holds of requests still in flight go back into Redis, whether it lost
them (back empty) or never had them (reserved in this process while Redis was away)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from spillgate.gateway.accounting import Accountant, QuotaExceeded, TenantLimits, make_client
from tests.gateway.test_accounting_redis import entry, wait_for
from tests.support.procs import free_port
from tests.support.redis_server import redis_url as private_redis

LIMITS = TenantLimits(usd_per_day=1.0)


async def test_holds_in_flight_survive_redis_coming_back_empty(tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    clients = [make_client(url), make_client(url)]
    pair = [
        Accountant(tmp_path / f"l{i}.sqlite3", redis=c, key_prefix="rejoin", replay_interval_s=0.05, epoch_check_s=0.1)
        for i, c in enumerate(clients)
    ]
    for accountant in pair:
        assert accountant.shared is not None
        accountant.shared.processes = lambda: 2  # each waits for the other to put its spend back
    now = time.time()
    try:
        with private_redis(tmp_path, port=port):
            for accountant in pair:
                await accountant.start(now=now)
            held = await pair[0].reserve("acme", LIMITS, tokens=1, worst_case_usd=0.6, hosted=False, now=now)
            lost = pair[0].shared.epoch
        with private_redis(tmp_path, port=port):  # back, empty: the 0.6 is still in flight
            await wait_for(lambda: all(a.shared.epoch != lost and not a.degraded for a in pair))
            with pytest.raises(QuotaExceeded):
                await pair[1].reserve("acme", LIMITS, tokens=1, worst_case_usd=0.5, hosted=False, now=now)
            second = await pair[1].reserve("acme", LIMITS, tokens=1, worst_case_usd=0.4, hosted=False, now=now)
            assert second.shared
            await pair[0].settle(held, entry(cost=0.1, at=now))  # its put-back hold goes with it
            report = await pair[1].spend("acme", LIMITS, now=now)
            assert round(report.today.total.usd, 6) == 0.1 and round(report.today.held_usd, 6) == 0.4
    finally:
        for accountant, client in zip(pair, clients, strict=True):
            await accountant.stop()
            await client.aclose()


async def test_a_hold_reserved_while_redis_was_away_is_put_back(tmp_path: Path) -> None:
    port = free_port()
    client = make_client(f"redis://127.0.0.1:{port}/0")
    accountant = Accountant(tmp_path / "l.sqlite3", redis=client, key_prefix="away", replay_interval_s=0.05)
    now = time.time()
    try:
        with private_redis(tmp_path, port=port):
            await accountant.start(now=now)
            first = await accountant.reserve("acme", LIMITS, tokens=1, worst_case_usd=0.0, hosted=False, now=now)
            await accountant.release(first, now=now)  # this process has seen the shared totals
            await client.save()
        away = await accountant.reserve("acme", LIMITS, tokens=1, worst_case_usd=0.7, hosted=False, now=now)
        assert not away.shared and accountant.degraded
        with private_redis(tmp_path, port=port):  # back with its data, which never saw the 0.7
            await wait_for(lambda: not accountant.degraded)
            assert round((await accountant.spend("acme", LIMITS, now=now)).today.held_usd, 6) == 0.7
            with pytest.raises(QuotaExceeded):
                await accountant.reserve("acme", LIMITS, tokens=1, worst_case_usd=0.4, hosted=False, now=now)
            await accountant.settle(away, entry(cost=0.2, at=now))
            report = await accountant.spend("acme", LIMITS, now=now)
            assert round(report.today.total.usd, 6) == 0.2 and report.today.held_usd == 0
    finally:
        await accountant.stop()
        await client.aclose()
