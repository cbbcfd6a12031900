"""``spillgate serve --workers 2``: two gateway processes on one port acting as one gateway.

The parent starts the simulated hosted model once and a private redis-server (the config names no Redis); the
two workers share a tenant's budget and the config's versions through it, and one that dies is replaced.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.gateway.test_serve import alive, child_pids
from tests.support.procs import RunningProcess, free_port, start_spillgate

KEY = "sk-workers-tenant"
STREAMER_KEY = "sk-workers-streamer"
ADMIN_KEY = "sk-workers-admin"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
PRICES = {"input_per_mtok": 100.0, "output_per_mtok": 1000.0}
MAX_TOKENS = 32
BUDGET_USD = 0.5
STREAMS = 20


def workers_config(data_dir: Path) -> dict[str, Any]:
    hosted = {"name": "frontier", "model": "openai/frontier", "api_key": "sk-provider", **PRICES}
    hosted["simulated"] = {"ttft_ms": 200, "tpot_ms": 20}
    return {
        "pools": [],
        "hosted_models": [hosted],
        "routes": [{"name": "frontier", "targets": ["frontier"]}],
        "tenants": [
            {"name": "racer", "keys": [KEY], "routes": ["frontier"], "budget": {"usd_per_day": BUDGET_USD}},
            {"name": "streamer", "keys": [STREAMER_KEY], "routes": ["frontier"]},
        ],
        "admin": {"keys": [ADMIN_KEY]},
        "limits": {"max_connections_per_client": 0},
        "state": {"data_dir": str(data_dir)},
        "secrets": {"upstream_hosts": ["127.0.0.1"]},  # an admin edit may add a provider on this machine
    }


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[RunningProcess]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    path = tmp_path / "workers.yaml"
    path.write_text(yaml.safe_dump(workers_config(tmp_path / "data")))
    command = ["serve", "--config", str(path), "--port", str(port), "--workers", "2"]
    gateway = start_spillgate(command, port=port, log_dir=tmp_path, ready_path="/ready", timeout=120)
    try:
        yield gateway
    finally:
        gateway.stop(timeout=60)


def body(index: int) -> bytes:
    """The exact bytes sent: the gateway holds a prompt of as many tokens as the body has bytes."""
    message = {"role": "user", "content": f"worker race {index:03d}"}
    return orjson.dumps({"model": "frontier", "messages": [message], "max_tokens": MAX_TOKENS, "stream": True})


def worst_case_usd() -> float:
    return (len(body(0)) * PRICES["input_per_mtok"] + MAX_TOKENS * PRICES["output_per_mtok"]) / 1e6


def health(gateway: RunningProcess) -> dict[str, Any]:
    """``/health`` of whichever worker accepts a new connection."""
    return httpx.get(gateway.url + "/health", timeout=10).json()


def worker_pids(gateway: RunningProcess, want: int = 2, tries: int = 400) -> set[int]:
    """The pids answering ``/health`` on new connections, until ``want`` distinct ones were seen."""
    seen: set[int] = set()
    for _ in range(tries):
        seen.add(health(gateway)["pid"])
        if len(seen) >= want:
            break
    return seen


def eventually(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


async def race(url: str, count: int) -> list[int]:
    """``count`` streamed requests at once, each on its own connection (so both workers take some)."""

    async def one(index: int) -> int:
        headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
        async with (
            httpx.AsyncClient(timeout=60) as client,
            client.stream("POST", url + "/v1/chat/completions", content=body(index), headers=headers) as response,
        ):
            async for _ in response.aiter_bytes():
                pass
            return response.status_code

    return await asyncio.gather(*(one(index) for index in range(count)))


async def stop_while_streaming(gateway: RunningProcess, count: int) -> list[list[str]]:
    """``count`` streams on their own connections; SIGTERM to the parent once tokens flow on every one. Returns
    each stream's non-empty lines."""
    payload = {"model": "frontier", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "stream": True}
    headers = {"authorization": f"Bearer {STREAMER_KEY}"}
    flowing: list[asyncio.Event] = [asyncio.Event() for _ in range(count)]

    async def one(index: int) -> list[str]:
        lines: list[str] = []
        async with (
            httpx.AsyncClient(timeout=60) as client,
            client.stream("POST", gateway.url + "/v1/chat/completions", json=payload, headers=headers) as response,
        ):
            async for line in response.aiter_lines():
                if line:
                    lines.append(line)
                    flowing[index].set()
        flowing[index].set()
        return lines

    tasks = [asyncio.create_task(one(index)) for index in range(count)]
    await asyncio.wait_for(asyncio.gather(*(event.wait() for event in flowing)), 60)
    os.killpg(gateway.pid, signal.SIGTERM)
    return await asyncio.gather(*tasks)


def test_two_workers_act_as_one_gateway_and_stop_as_one(two_workers: RunningProcess, tmp_path: Path) -> None:
    gateway = two_workers
    children = child_pids(gateway.pid)  # two workers, the simulated hosted model (started once), a redis-server
    assert len(children) == 4
    pids = worker_pids(gateway)
    assert len(pids) == 2, "both workers accept connections on the one port"
    assert pids <= set(children)
    eventually(lambda: health(gateway).get("peer_processes") == 1)  # each sees the other through Redis

    # A budget race over both: the shared budget admits what one process would, give or take one request each.
    statuses = asyncio.run(race(gateway.url, 40))
    assert statuses.count(429) > 0 and statuses.count(200) > 0 and set(statuses) <= {200, 429}, statuses
    assert statuses.count(200) * worst_case_usd() < 2 * BUDGET_USD, "each process admitted against its own budget"

    # A config edit through the admin API on one worker is applied by the other.
    config = httpx.get(gateway.url + "/admin/config", headers=ADMIN).json()["config"]
    config["routes"][0]["aliases"] = ["frontier-alias"]
    version = httpx.put(gateway.url + "/admin/config", json=config, headers=ADMIN, timeout=30).json()["version"]

    def both_run_it() -> bool:
        versions: dict[int, int] = {}
        for _ in range(100):
            answer = health(gateway)
            versions[answer["pid"]] = answer["config_version"]
            if len(versions) == 2:
                break
        return len(versions) == 2 and set(versions.values()) == {version}

    eventually(both_run_it)

    # SIGTERM to the parent during streams over both workers: every stream finishes, then everything stops.
    results = asyncio.run(stop_while_streaming(gateway, STREAMS))
    for lines in results:
        assert lines[-1] == "data: [DONE]", lines[-3:]
    gateway.popen.wait(timeout=60)
    assert gateway.popen.returncode == 0
    eventually(lambda: not [pid for pid in children if alive(pid)])
    with sqlite3.connect(tmp_path / "data" / "ledger.sqlite3") as db:
        count, spent = db.execute(
            "SELECT count(*), coalesce(sum(cost_usd), 0) FROM entries WHERE tenant = 'racer'"
        ).fetchone()
        streamed = db.execute("SELECT count(*) FROM entries WHERE tenant = 'streamer' AND outcome = 'ok'").fetchone()
    assert count == statuses.count(200), "every served request is in the shared ledger, flushed at the stop"
    assert spent <= BUDGET_USD + 2 * worst_case_usd(), f"spent {spent} of a {BUDGET_USD} budget"
    assert streamed[0] == STREAMS


def test_a_worker_that_dies_is_replaced(two_workers: RunningProcess) -> None:
    gateway = two_workers
    before = worker_pids(gateway)
    assert len(before) == 2
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    # The other keeps serving on the same port while the parent starts a replacement.
    assert httpx.get(gateway.url + "/ready", timeout=10).status_code == 200

    def replaced() -> bool:
        serving = worker_pids(gateway, tries=50)
        return victim not in serving and len(serving) == 2 and serving <= set(child_pids(gateway.pid))

    eventually(replaced, timeout=90)


def test_a_provider_key_sent_to_one_worker_serves_on_both(two_workers: RunningProcess, tmp_path: Path) -> None:
    """A literal key in an admin edit is stored redacted in the shared version; the worker that did not receive it
    finds it in the data directory the two share, so both run the version."""
    gateway = two_workers
    port = free_port()
    provider_key = "sk-sent-through-the-api"
    args = ["sim-hosted", "--port", str(port), "--model-name", "second", "--api-key", provider_key]
    provider = start_spillgate([*args, "--ttft-ms", "5", "--tpot-ms", "1"], port=port, log_dir=tmp_path)
    try:
        config = httpx.get(gateway.url + "/admin/config", headers=ADMIN).json()["config"]
        second = {"name": "second", "model": "openai/second", "api_base": f"{provider.url}/v1", **PRICES}
        config["hosted_models"].append({**second, "api_key": provider_key})
        config["routes"].append({"name": "second", "targets": ["second"]})
        config["tenants"][1]["routes"].append("second")
        answer = httpx.put(gateway.url + "/admin/config", json=config, headers=ADMIN, timeout=30)
        assert answer.status_code == 200, answer.text
        version = answer.json()["version"]

        def both_run_it() -> bool:
            seen: dict[int, int] = {}
            for _ in range(100):
                reply = health(gateway)
                seen[reply["pid"]] = reply["config_version"]
                if len(seen) == 2:
                    break
            return len(seen) == 2 and set(seen.values()) == {version}

        eventually(both_run_it)
        served: dict[str, int] = {}
        for index in range(12):
            reply = httpx.post(
                gateway.url + "/v1/chat/completions",
                json={"model": "second", "messages": [{"role": "user", "content": f"hi {index}"}], "max_tokens": 2},
                headers={"authorization": f"Bearer {STREAMER_KEY}"},
                timeout=30,
            )
            served[str(reply.status_code)] = served.get(str(reply.status_code), 0) + 1
        assert served == {"200": 12}, served
        assert len(worker_pids(gateway)) == 2
    finally:
        provider.stop()
