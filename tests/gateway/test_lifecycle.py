"""A gateway told to stop (SIGTERM) drains: ``/ready`` and new completions answer 503 at once, what is in flight
finishes within ``timeouts.drain_s``, a stream still open at the deadline ends with an error event, the ledger is
flushed, and the process exits."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.support.gateway import TENANT_KEY, gateway_config, gateway_over_one_replica, start_gateway, start_replica
from tests.support.procs import RunningProcess

HEADERS = {"authorization": f"Bearer {TENANT_KEY}"}
SLOW = ("--time-scale", "10")
"""An 8B replica at a tenth of real speed: tens of milliseconds a token, so streams are still open when told."""
STREAMS = 20


def slow_gateway(tmp_path: Path, drain_s: float) -> Iterator[RunningProcess]:
    def edit(config: dict[str, Any]) -> None:
        config["timeouts"] = {"drain_s": drain_s}
        config["state"] = {"data_dir": str(tmp_path / "data")}

    yield from gateway_over_one_replica(tmp_path, edit, *SLOW)


@pytest.fixture
def draining_gateway(tmp_path: Path) -> Iterator[RunningProcess]:
    yield from slow_gateway(tmp_path, drain_s=60)


@pytest.fixture
def hasty_gateway(tmp_path: Path) -> Iterator[RunningProcess]:
    yield from slow_gateway(tmp_path, drain_s=1)


def request(max_tokens: int, *, stream: bool) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Tell me a long story."}]
    return {"model": "chat", "messages": messages, "max_tokens": max_tokens, "stream": stream}


async def read_stream(url: str, max_tokens: int, flowing: asyncio.Event) -> list[str]:
    """One stream read to its end (a body cut short raises), its non-empty lines; ``flowing`` set at the first."""
    lines: list[str] = []
    async with (
        httpx.AsyncClient(timeout=120) as client,
        client.stream(
            "POST", url + "/v1/chat/completions", json=request(max_tokens, stream=True), headers=HEADERS
        ) as r,
    ):
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line:
                lines.append(line)
                flowing.set()
    flowing.set()
    return lines


def ledger(data_dir: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(data_dir / "ledger.sqlite3") as db:
        return db.execute("SELECT outcome, completion_tokens FROM entries").fetchall()


def test_sigterm_lets_streams_finish_while_refusing_new_requests(
    draining_gateway: RunningProcess, tmp_path: Path
) -> None:
    gateway = draining_gateway

    async def scenario() -> tuple[list[list[str]], httpx.Response, httpx.Response, dict[str, Any]]:
        flowing = [asyncio.Event() for _ in range(STREAMS)]
        streams = [asyncio.create_task(read_stream(gateway.url, 60, event)) for event in flowing]
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in flowing)), 60)
        os.killpg(gateway.pid, signal.SIGTERM)
        async with httpx.AsyncClient(timeout=30) as client:
            while (ready := await client.get(gateway.url + "/ready")).status_code == 200:
                await asyncio.sleep(0.02)  # the signal is handled between two ticks of the event loop
            refused = await client.post(
                gateway.url + "/v1/chat/completions", json=request(4, stream=False), headers=HEADERS
            )
            health = (await client.get(gateway.url + "/health")).json()
        return await asyncio.gather(*streams), ready, refused, health

    results, ready, refused, health = asyncio.run(scenario())
    assert ready.status_code == 503 and ready.json() == {"status": "draining"}
    assert health["draining"] is True
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "shutting_down" and refused.json()["error"]["type"]
    for lines in results:
        assert lines[-1] == "data: [DONE]", lines[-3:]
        assert not any('"error"' in line for line in lines)
    gateway.popen.wait(timeout=90)
    assert gateway.popen.returncode == 0
    served = [tokens for outcome, tokens in ledger(tmp_path / "data") if outcome == "ok"]
    assert served == [60] * STREAMS, "every stream is booked in full: the ledger was flushed at the exit"


def test_a_stream_still_open_at_the_deadline_ends_with_an_error_event(
    hasty_gateway: RunningProcess, tmp_path: Path
) -> None:
    gateway = hasty_gateway

    async def scenario() -> tuple[list[str], httpx.Response]:
        flowing = asyncio.Event()
        stream = asyncio.create_task(read_stream(gateway.url, 4000, flowing))
        async with httpx.AsyncClient(timeout=120) as client:
            whole = asyncio.create_task(
                client.post(gateway.url + "/v1/chat/completions", json=request(4000, stream=False), headers=HEADERS)
            )
            await asyncio.wait_for(flowing.wait(), 60)
            os.killpg(gateway.pid, signal.SIGTERM)
            return await stream, await whole

    lines, whole = asyncio.run(scenario())
    assert lines[0].startswith("data: {") and '"error"' not in lines[0]
    last = lines[-1]
    assert last.startswith("data: "), last
    error = orjson.loads(last.removeprefix("data: "))["error"]
    assert error["code"] == "shutting_down" and error["type"] and "drain_s" in error["message"]
    assert whole.status_code == 503 and whole.json()["error"]["code"] == "shutting_down"
    assert whole.headers["retry-after"] == "1"
    gateway.popen.wait(timeout=60)
    assert gateway.popen.returncode == 0
    assert [outcome for outcome, _ in ledger(tmp_path / "data")] == ["shutting_down"] * 2


def test_health_is_degraded_while_a_route_has_no_healthy_backend(tmp_path: Path) -> None:
    """Liveness stays 200 (a restart would not bring a replica back); the report says which routes cannot serve."""
    replica = start_replica(tmp_path, *SLOW)
    try:
        config = gateway_config([replica.url], state={"data_dir": str(tmp_path / "data")})
        gateway = start_gateway(config, tmp_path, ready_path="/ready")
        try:
            healthy = httpx.get(gateway.url + "/health").json()
            assert healthy["status"] == "ok" and "routes_without_healthy_backend" not in healthy
            replica.stop()
            deadline = time.monotonic() + 30
            while (answer := httpx.get(gateway.url + "/health")).json()["status"] == "ok":
                assert time.monotonic() < deadline, "the replica never left rotation"
                time.sleep(0.1)
            assert answer.status_code == 200
            assert answer.json()["status"] == "degraded"
            assert answer.json()["routes_without_healthy_backend"] == ["chat", "chat-rr"]
            assert httpx.get(gateway.url + "/ready").status_code == 503
        finally:
            gateway.stop()
    finally:
        replica.stop()
