"""Exact prefix routing over real SGLang with ``--dp-size 2``: two schedulers, each with its own KV cache and its
own KV-event publisher (the configured port + its rank). The gateway learns the ranks from ``/server_info``,
follows both, and sends each turn of a conversation to the rank holding it, predicting its cached tokens exactly.
About three minutes on two cores, most of it the engine's start."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.engines.install import installed_already
from tests.engines.servers import RECOMMENDED, SERVED_MODEL, start_engine
from tests.gateway.test_kv_events import conversation
from tests.support.gateway import TENANT_KEY, gateway_config, replica_name, start_gateway
from tests.support.procs import RunningProcess, free_ports

pytestmark = [
    pytest.mark.engines,
    pytest.mark.skipif(
        os.environ.get("SPILLGATE_KV_EVENTS_TIER") != "1",
        reason="part of the KV-event tier: run with SPILLGATE_KV_EVENTS_TIER=1 make test-engines (docs/testing.md)",
    ),
]

RANKS = 2


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningProcess, RunningProcess, int]]:
    installed = installed_already(("sglang",))
    if installed is None:
        pytest.skip("SGLang is not installed (make engines)")
    log_dir: Path = tmp_path_factory.mktemp("dp-sglang")
    publish, replay = free_ports(RANKS), free_ports(RANKS)
    events = {"publisher": "zmq", "endpoint": f"tcp://*:{publish}", "replay_endpoint": f"tcp://*:{replay}"}
    flags = (*RECOMMENDED["sglang"], "--dp-size", str(RANKS), "--kv-events-config", json.dumps(events))
    # On a CPU each rank binds its threads to a NUMA node of its own unless told which cores: half the cores each.
    count = os.cpu_count() or 1
    if count < RANKS:
        pytest.skip(f"{RANKS} ranks need {RANKS} cores")
    half = count // RANKS
    cores = {"SGLANG_CPU_OMP_THREADS_BIND": f"0-{half - 1}|{half}-{2 * half - 1}"}
    replica = start_engine(installed, "sglang", log_dir, *flags, kv_tokens=8192, env=cores)
    try:
        config = gateway_config([replica.url])
        config["pools"][0].update({"engine": "sglang", "served_model": SERVED_MODEL, "prefill_tokens_per_s": 1_000_000})
        config["prefix"] = {"tokenizer": str(installed.model), "block_tokens": 64}
        config["routes"].append({"name": "aware", "targets": ["pool"], "policy": "cache_aware"})
        config["health"] = {"interval_s": 0.25, "timeout_s": 10.0, "unhealthy_after": 2}
        proc = start_gateway(config, log_dir)
        try:
            yield proc, replica, publish
        finally:
            proc.stop()
    finally:
        replica.stop()


def prefix_health(gateway: RunningProcess, replica: RunningProcess) -> dict:
    return httpx.get(gateway.url + "/health").json()["backends"][replica_name(replica)]["prefix"]


def test_each_turn_goes_to_the_rank_holding_its_conversation(
    gateway: tuple[RunningProcess, RunningProcess, int],
) -> None:
    proc, replica, publish = gateway
    deadline = time.monotonic() + 60
    while True:
        ranks = prefix_health(proc, replica).get("dp_ranks", [])
        if len(ranks) == RANKS and all(r["complete"] and r["caught_up"] for r in ranks):
            break
        assert time.monotonic() < deadline, ranks
        time.sleep(0.5)
    assert [r["endpoint"] for r in ranks] == [f"tcp://127.0.0.1:{publish + r}" for r in range(RANKS)]
    client = openai.OpenAI(base_url=proc.url + "/v1", api_key=TENANT_KEY, max_retries=0, timeout=300)
    turns = [(1, 0), (2, 0), (3, 0), (1, 1), (1, 2), (3, 1), (2, 1), (2, 2), (3, 2)]
    for group, turn in turns:
        raw = client.chat.completions.with_raw_response.create(
            model="aware", messages=conversation(group, turn), max_tokens=2
        )
        usage = raw.parse().usage
        assert usage is not None and usage.prompt_tokens_details is not None
        if turn:
            assert usage.prompt_tokens_details.cached_tokens > usage.prompt_tokens - 100, (group, turn, usage)
        time.sleep(0.3)  # its events are in before the next turn is decided
    seen = prefix_health(proc, replica)
    assert seen["predictions"]["events"] == {"exact": len(turns)}, seen["predictions"]
    assert all(r["gaps"] == 0 and r["batches"] > 0 for r in seen["dp_ranks"]), seen["dp_ranks"]
