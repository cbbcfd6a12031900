"""What the gateway's probes conclude about a replica's prefix cache: kept through a slow spell, gone after a
restart (whether or not a probe caught the replica down)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from spillgate.backends.registry import Backend, BackendRegistry
from tests.gateway.test_cache_aware import ask
from tests.support.gateway import TENANT_KEY, gateway_config, replica_name, start_gateway, start_replica
from tests.support.procs import RunningProcess


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[RunningProcess]:
    started = start_replica(tmp_path, "--time-scale", "0.02")
    yield started
    started.stop()


def aware_gateway(replica: RunningProcess, tmp_path: Path) -> RunningProcess:
    config = gateway_config([replica.url])
    config["routes"].append({"name": "aware", "targets": ["pool"], "policy": "cache_aware"})
    return start_gateway(config, tmp_path)


def test_a_restarted_replica_starts_with_an_empty_index(replica: RunningProcess, tmp_path: Path) -> None:
    port = int(replica.url.rsplit(":", 1)[1])
    gateway = aware_gateway(replica, tmp_path)
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    restarted = None
    try:
        ask(client, "aware", 400, "first")
        assert ask(client, "aware", 400, "second")[1] == "prefix_hit"
        replica.stop()
        wait_for_health(gateway, replica, healthy=False)
        restarted = start_replica(tmp_path, "--time-scale", "0.02", port=port)
        wait_for_health(gateway, replica, healthy=True)
        _, reason, usage = ask(client, "aware", 400, "third")
        assert reason == "least_ttft", "the index must forget what the old process cached"
        assert usage.prompt_tokens_details.cached_tokens < 50
    finally:
        gateway.stop()
        if restarted is not None:
            restarted.stop()


def test_a_replica_that_only_answered_slowly_keeps_its_index(replica: RunningProcess, tmp_path: Path) -> None:
    """A probe timing out takes a replica out of rotation, but its cache is still there when it answers again:
    forgetting it would scatter every conversation it holds."""
    gateway = aware_gateway(replica, tmp_path)
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    try:
        ask(client, "aware", 500, "first")
        os.killpg(replica.pid, signal.SIGSTOP)  # the process lives, but answers nothing
        try:
            wait_for_health(gateway, replica, healthy=False)
        finally:
            os.killpg(replica.pid, signal.SIGCONT)
        wait_for_health(gateway, replica, healthy=True)
        _, reason, usage = ask(client, "aware", 500, "second")
        assert reason == "prefix_hit"
        assert usage.prompt_tokens_details.cached_tokens > 0.8 * usage.prompt_tokens
    finally:
        gateway.stop()


class RecordedEvents:
    """A :class:`~backends.registry.ReplicaEvents` that keeps what it was told."""

    def __init__(self) -> None:
        self.restarts: list[str] = []
        self.capacities: list[tuple[str, int]] = []

    def capacity_known(self, replica: str, max_total_tokens: int) -> None:
        self.capacities.append((replica, max_total_tokens))

    def restarted(self, replica: str) -> None:
        self.restarts.append(replica)


async def test_a_restart_between_two_probes_is_seen_in_the_counters(replica: RunningProcess, tmp_path: Path) -> None:
    """SGLang's counters start again from zero in a new process: a restart no probe saw still clears the cache."""
    port = int(replica.url.rsplit(":", 1)[1])
    events = RecordedEvents()
    backend = Backend("pool-0", "replica", replica.url, "sim-model")
    registry = BackendRegistry([backend], interval_s=3600, timeout_s=5, unhealthy_after=1, events=events)
    await registry.start()  # one probe now; the next only when asked
    restarted = None
    try:
        request = {"model": "sim-model", "messages": [{"role": "user", "content": "hello " * 200}], "max_tokens": 2}
        async with httpx.AsyncClient() as client:
            (await client.post(replica.url + "/v1/chat/completions", json=request)).raise_for_status()
        await registry.poll_once()
        assert backend.load.prompt_tokens_total > 0
        assert events.restarts == []

        replica.stop()
        restarted = start_replica(tmp_path, "--time-scale", "0.02", port=port)
        await registry.poll_once()
        assert events.restarts == ["pool-0"]
        assert events.capacities == [("pool-0", backend.max_total_tokens)] * 2, "a new process's capacity is read"
        assert backend.healthy
        await registry.poll_once()
        assert events.restarts == ["pool-0"], "one restart, reported once"
    finally:
        await registry.stop()
        if restarted is not None:
            restarted.stop()


async def test_a_request_of_ours_that_ends_during_a_scrape_is_not_other_clients_load(
    replica: RunningProcess,
) -> None:
    """The replica counts our request while answering a scrape that our count drops during: the probe must not
    take it for another client's, which would steer new prefixes away from that replica for a whole interval."""
    backend = Backend("pool-0", "replica", replica.url, "sim-model")
    registry = BackendRegistry([backend], interval_s=3600, timeout_s=5, unhealthy_after=1)
    await registry.start()
    # Long enough to outlast a loaded machine's pauses (4,000 tokens took under a second of wall time here).
    request = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100_000}
    try:
        async with (
            httpx.AsyncClient() as client,
            client.stream("POST", replica.url + "/v1/chat/completions", json={**request, "stream": True}) as stream,
        ):
            await anext(stream.aiter_lines())  # running there now; the gateway's books say so too
            backend.own.in_flight, backend.own.sent_total = 1, 1
            os.killpg(replica.pid, signal.SIGSTOP)  # the scrape below waits for the replica...
            try:
                scrape = asyncio.create_task(registry.poll_once())
                await asyncio.sleep(0.2)
                backend.own.in_flight = 0  # ...while our request is settled as far as the gateway can tell
            finally:
                os.killpg(replica.pid, signal.SIGCONT)
            await scrape
        assert backend.load.running == 1, "the replica still counted it"
        assert backend.external_load == 0
    finally:
        await registry.stop()


def wait_for_health(gateway: RunningProcess, replica: RunningProcess, *, healthy: bool) -> None:
    name, deadline = replica_name(replica), time.monotonic() + 10
    while httpx.get(gateway.url + "/health").json()["backends"][name]["healthy"] != healthy:
        assert time.monotonic() < deadline, f"{name} never became healthy={healthy}"
        time.sleep(0.05)
