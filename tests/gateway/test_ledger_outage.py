"""A ledger file that cannot be written: the gateway keeps serving, says it is degraded, and loses no entry."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.support.gateway import TENANT_KEY, gateway_config, start_gateway, start_replica


def eventually(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


def test_a_locked_ledger_file_degrades_the_gateway_until_it_can_write_again(tmp_path: Path) -> None:
    replica = start_replica(tmp_path, "--time-scale", "0.05")
    data_dir = tmp_path / "data"
    gateway = start_gateway(gateway_config([replica.url], state={"data_dir": str(data_dir)}), tmp_path)
    locker = sqlite3.connect(data_dir / "ledger.sqlite3", isolation_level=None)
    try:
        assert httpx.get(gateway.url + "/health").json()["ledger"] == "ok"
        locker.execute("BEGIN EXCLUSIVE")  # another process holds the write lock past the busy timeout
        for _ in range(3):
            response = httpx.post(
                gateway.url + "/v1/chat/completions",
                json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                headers={"authorization": f"Bearer {TENANT_KEY}"},
                timeout=30,
            )
            assert response.status_code == 200, "a ledger that cannot write does not stop serving"
        eventually(lambda: httpx.get(gateway.url + "/health").json()["status"] == "degraded")
        health = httpx.get(gateway.url + "/health").json()
        assert health["ledger"] == "failing: 3 entries wait in memory", health
        assert 'spillgate_degraded{component="ledger"} 1.0' in httpx.get(gateway.url + "/metrics").text
        locker.execute("ROLLBACK")
        eventually(lambda: httpx.get(gateway.url + "/health").json()["status"] == "ok")
        (booked,) = locker.execute("SELECT COUNT(*) FROM entries").fetchone()
        assert booked == 3, "every request served while the file was locked is in it now"
    finally:
        locker.close()
        gateway.stop()
        replica.stop()


def _entries(ledger: Path) -> int:
    with sqlite3.connect(ledger) as db:
        (count,) = db.execute("SELECT COUNT(*) FROM entries").fetchone()
    return count


def test_a_killed_gateway_loses_no_ledger_entry(tmp_path: Path, redis_url: str) -> None:
    """``kill -9`` right after the last answer: the entries not yet committed are in the journal, and the
    next start puts them in the ledger (and Redis, which counts each once)."""
    replica = start_replica(tmp_path, "--time-scale", "0.02")
    data_dir = tmp_path / "data"
    state = {"data_dir": str(data_dir), "redis_url": redis_url, "key_prefix": f"kill-{time.time_ns()}"}
    config = gateway_config([replica.url], state=state)
    gateway = start_gateway(config, tmp_path)
    sent = 40
    try:
        with httpx.Client(headers={"authorization": f"Bearer {TENANT_KEY}"}, timeout=30) as client:
            for index in range(sent):
                body = {"model": "chat", "messages": [{"role": "user", "content": f"hi {index}"}], "max_tokens": 2}
                assert client.post(gateway.url + "/v1/chat/completions", json=body).status_code == 200
        gateway.popen.kill()
        gateway.popen.wait(timeout=10)
        committed = _entries(data_dir / "ledger.sqlite3")
        gateway = start_gateway(config, tmp_path)
        assert _entries(data_dir / "ledger.sqlite3") == sent, f"{committed} were committed before the kill"
        auth = {"authorization": f"Bearer {TENANT_KEY}"}
        eventually(lambda: httpx.get(gateway.url + "/v1/spend", headers=auth).json()["today"]["requests"] == sent)
    finally:
        gateway.stop()
        replica.stop()
