"""A budget race over two gateways while Redis restarts empty: the spend stays within the budget plus one
request's worst case per process.

The restart lands mid-race: requests hold budget in flight, their settles go to a Redis that never saw their
holds, and the gateways notice the empty store one call at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis
import yaml

from tests.support.procs import RunningProcess, free_port, start_spillgate

BUDGET_USD = 1.0
PRICES = {"input_per_mtok": 100.0, "output_per_mtok": 1000.0}
MAX_TOKENS = 32
REQUESTS = 200
SEND_EVERY_S = 0.01
RESTART_AT_S = 0.4
KEY = "sk-budget-race"
HOSTED_TIMING = ("--ttft-ms", "200", "--tpot-ms", "30")
"""A request takes about a second: longer than a gateway takes to see Redis back (a shipper pass), so the
holds lost with Redis are still in flight when the gateways admit again."""


class Redis:
    """A private ``redis-server`` without persistence, killed and restarted (empty) on the same port."""

    def __init__(self, work_dir: Path) -> None:
        self.port = free_port()
        self.work_dir = work_dir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        args = ["--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(
            [binary, *args, "--dir", str(self.work_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with contextlib.closing(redis.Redis(port=self.port)) as client:
                    client.ping()
                return
            except redis.ConnectionError:
                assert time.monotonic() < deadline and self.proc.poll() is None, "redis-server did not start"
                time.sleep(0.01)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def config(hosted_url: str, redis_url: str, data_dir: Path) -> dict[str, Any]:
    return {
        "pools": [],
        "hosted_models": [
            {
                "name": "frontier",
                "model": "openai/frontier",
                "api_base": hosted_url + "/v1",
                "api_key": "sk-provider",
                **PRICES,
            }
        ],
        "routes": [{"name": "frontier", "targets": ["frontier"]}],
        "tenants": [{"name": "racer", "keys": [KEY], "routes": ["frontier"], "budget": {"usd_per_day": BUDGET_USD}}],
        "state": {"data_dir": str(data_dir), "redis_url": redis_url, "key_prefix": "race"},
    }


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Redis, list[RunningProcess], list[Path]]]:
    """Redis, a simulated hosted model and two gateways sharing that Redis, each with its own ledger (the
    three started side by side: each takes seconds to import on a busy machine)."""
    store = Redis(tmp_path / "redis")
    store.start()
    hosted_port, ports = free_port(), [free_port(), free_port()]
    hosted_url = f"http://127.0.0.1:{hosted_port}"
    ledgers = [tmp_path / f"data{index}" / "ledger.sqlite3" for index in range(2)]
    commands = [["sim-hosted", "--port", str(hosted_port), "--model-name", "frontier", *HOSTED_TIMING]]
    for index, port in enumerate(ports):
        path = tmp_path / f"gateway{index}.yaml"
        path.write_text(yaml.safe_dump(config(hosted_url, store.url, ledgers[index].parent)))
        commands.append(["serve", "--config", str(path), "--port", str(port)])
    with ThreadPoolExecutor(len(commands)) as pool:
        futures = [
            pool.submit(start_spillgate, command, port=port, log_dir=tmp_path)
            for command, port in zip(commands, [hosted_port, *ports], strict=True)
        ]
    started = [future.result() for future in futures if future.exception() is None]
    try:
        for future in futures:
            future.result()  # raises what failed to start, once the others are in hand to stop
        yield store, started[1:], ledgers
    finally:
        for proc in reversed(started):
            proc.stop()
        store.kill()


def body(index: int) -> bytes:
    """The exact bytes sent: the gateway holds a prompt of as many tokens as the body has bytes."""
    message = {"role": "user", "content": f"race request {index:03d}"}
    return orjson.dumps({"model": "frontier", "messages": [message], "max_tokens": MAX_TOKENS, "stream": True})


def worst_case_usd() -> float:
    return (len(body(0)) * PRICES["input_per_mtok"] + MAX_TOKENS * PRICES["output_per_mtok"]) / 1e6


async def race(gateways: list[RunningProcess], store: Redis) -> list[tuple[float, int]]:
    """Send the requests at a steady pace over both gateways; restart Redis empty ``RESTART_AT_S`` in.
    Returns when each was sent (seconds in) and its status."""
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    limits = httpx.Limits(max_connections=REQUESTS)
    async with httpx.AsyncClient(timeout=30, headers=headers, limits=limits) as client:

        async def one(index: int) -> tuple[float, int]:
            await asyncio.sleep(index * SEND_EVERY_S)
            url = gateways[index % 2].url + "/v1/chat/completions"
            async with client.stream("POST", url, content=body(index)) as response:
                await response.aread()
                return index * SEND_EVERY_S, response.status_code

        async def restart() -> None:
            await asyncio.sleep(RESTART_AT_S)
            store.kill()
            await asyncio.to_thread(store.start)

        statuses, _ = await asyncio.gather(asyncio.gather(*(one(i) for i in range(REQUESTS))), restart())
    return list(statuses)


def spent(ledgers: list[Path]) -> float:
    total = 0.0
    for path in ledgers:
        with sqlite3.connect(path) as db:
            (usd,) = db.execute("SELECT COALESCE(SUM(cost_usd), 0) FROM entries WHERE tenant = 'racer'").fetchone()
        total += usd
    return total


def test_a_budget_race_through_an_empty_redis_restart_overshoots_by_at_most_one_request_per_process(
    fleet: tuple[Redis, list[RunningProcess], list[Path]],
) -> None:
    store, gateways, ledgers = fleet
    outcomes = asyncio.run(race(gateways, store))
    statuses = [status for _, status in outcomes]
    assert set(statuses) <= {200, 429}, statuses
    admitted_after = sum(1 for at, status in outcomes if at > RESTART_AT_S and status == 200)
    assert statuses.count(429) > REQUESTS / 2, "the budget ran out during the race"
    for gateway in gateways:
        gateway.stop()  # a clean stop commits every entry to its ledger
    total, worst = spent(ledgers), worst_case_usd()
    overshoot = max(0.0, total - BUDGET_USD) / worst
    assert total <= BUDGET_USD + 2 * worst, (
        f"${total:.3f} spent: {overshoot:.1f} worst cases over, at most 2 "
        f"({statuses.count(200)} admitted, {admitted_after} sent after the restart)"
    )
