"""Streams cut off by a killed gateway: booked at the next start, once, and seen by the tenant's budget."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.support.gateway import TENANT_KEY, gateway_config, kill_while_streaming, start_gateway, start_replica
from tests.support.procs import RunningProcess, free_port, start_spillgate

STREAMS = 12
AUTH = {"authorization": f"Bearer {TENANT_KEY}"}


def eventually(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


class Stream(threading.Thread):
    """One streamed completion read until the gateway goes away; ``started`` is set after a few tokens."""

    def __init__(self, url: str, index: int) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.body = {
            "model": "frontier",
            "messages": [{"role": "user", "content": f"tell me a long story, number {index}"}],
            "max_tokens": 400,
            "stream": True,
        }
        self.request_id = ""
        self.tokens = 0
        self.finished = False
        self.started = threading.Event()

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url + "/v1/chat/completions", json=self.body, headers=AUTH, timeout=30) as r:
                self.request_id = r.headers["x-request-id"]
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        self.finished = True
                    elif line.startswith("data: ") and _content(orjson.loads(line[6:])):
                        self.tokens += 1
                        if self.tokens >= 3:
                            self.started.set()
        except httpx.HTTPError:
            pass  # the gateway was killed mid-stream
        finally:
            self.started.set()


def _content(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or [{}]
    return (choices[0].get("delta") or {}).get("content") or ""


def ledger_rows(data_dir: Path) -> list[tuple[str, str, float]]:
    with sqlite3.connect(data_dir / "ledger.sqlite3") as db:
        return db.execute("SELECT request_id, outcome, cost_usd FROM entries").fetchall()


def spend(gateway: RunningProcess) -> dict[str, Any]:
    return httpx.get(gateway.url + "/v1/spend", headers=AUTH, timeout=10).json()


def test_streams_cut_off_by_a_killed_gateway_are_booked_once_at_their_worst_case(
    tmp_path: Path, redis_url: str
) -> None:
    port = free_port()
    hosted = start_spillgate(
        ["sim-hosted", "--port", str(port), "--ttft-ms", "20", "--tpot-ms", "40", "--model-name", "m"],
        port=port,
        log_dir=tmp_path,
    )
    replica = start_replica(tmp_path, "--time-scale", "0.02")
    data_dir = tmp_path / "data"
    config = gateway_config(
        [replica.url],
        state={"data_dir": str(data_dir), "redis_url": redis_url, "key_prefix": f"killed-{time.time_ns()}"},
        hosted_models=[
            {
                "name": "oai",
                "model": "openai/m",
                "api_base": hosted.url + "/v1",
                "api_key": "sk-provider",
                "input_per_mtok": 3,
                "output_per_mtok": 15,
            }
        ],
    )
    config["routes"].append({"name": "frontier", "targets": ["oai"]})
    config["tenants"][0]["budget"] = {"usd_per_day": 100}  # its streams hold their worst case in Redis
    gateway = start_gateway(config, tmp_path)
    try:
        streams = [Stream(gateway.url, index) for index in range(STREAMS)]
        kill_while_streaming(gateway, streams)
        cut_off = {stream.request_id: stream.tokens for stream in streams if not stream.finished}
        assert len(cut_off) == STREAMS and all(tokens >= 3 for tokens in cut_off.values()), cut_off
        assert not set(cut_off) & {request for request, _, _ in ledger_rows(data_dir)}, "none ended before the kill"

        gateway = start_gateway(config, tmp_path)
        booked = [row for row in ledger_rows(data_dir) if row[0] in cut_off]
        assert sorted(request for request, _, _ in booked) == sorted(cut_off), "each cut-off stream, exactly once"
        for _, outcome, cost in booked:
            assert outcome == "gateway_killed"
            assert cost >= 400 * 15 / 1e6, "booked at its worst case: at least its whole output"
        worst = sum(cost for _, _, cost in booked)
        eventually(lambda: not spend(gateway)["degraded"])  # Redis has every entry: these are its figures
        today = spend(gateway)["today"]
        assert today["requests"] == STREAMS
        assert abs(today["usd"] - worst) < 1e-9 and abs(today["hosted_usd"] - worst) < 1e-9
        assert today["held_usd"] == 0, "the recovered entries dropped the holds of the killed streams"

        gateway.popen.kill()  # killed again: nothing is booked twice
        gateway.popen.wait(timeout=10)
        gateway = start_gateway(config, tmp_path)
        assert sorted(row[0] for row in ledger_rows(data_dir)) == sorted(cut_off)
        eventually(lambda: not spend(gateway)["degraded"])
        assert spend(gateway)["today"]["requests"] == STREAMS
    finally:
        gateway.stop()
        replica.stop()
        hosted.stop()
