"""The simulator's data parallelism (``--dp-size``): ranks with caches of their own, each publishing its KV events
on the configured port + its rank, a request going to the rank it names or else to the engine's default choice."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.sim.conftest import StartReplica
from tests.sim.test_kv_events import Subscriber, sglang_config, sync_by_flush
from tests.support.procs import RunningProcess, free_ports

PROMPT = " ".join(f"word{i}" for i in range(200))


def chat(
    sim: RunningProcess, content: str = PROMPT, headers: dict[str, str] | None = None, **extra: Any
) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 2, **extra}
    return httpx.post(sim.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def ranks(sim: RunningProcess) -> list[dict[str, Any]]:
    return httpx.get(sim.url + "/sim/dp_ranks").json()


def requests_per_rank(sim: RunningProcess) -> list[int]:
    return [rank["requests"] for rank in ranks(sim)]


@pytest.fixture(scope="module")
def two_ranks(start_sim: StartReplica) -> tuple[RunningProcess, int]:
    port = free_ports(2)  # rank r publishes on port + r
    config = sglang_config(port, replay_endpoint=f"tcp://127.0.0.1:{free_ports(2)}")
    sim = start_sim("sim-replica", "--time-scale", "0.02", "--dp-size", "2", "--kv-events-config", config)
    return sim, port


def test_server_info_counts_the_ranks_and_their_publishers(two_ranks: tuple[RunningProcess, int]) -> None:
    sim, port = two_ranks
    info = httpx.get(sim.url + "/server_info").json()
    assert info["dp_size"] == 2 and info["kv_events"]["dp_size"] == 2
    assert info["kv_events"]["endpoint_port_base"] == port
    assert len(info["internal_states"]) == 2


def test_vllms_face_lists_each_ranks_publisher(start_sim: StartReplica) -> None:
    port, replay = free_ports(3), free_ports(3)
    config = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}", "replay_endpoint": f"tcp://*:{replay}"}
    sim = start_sim(
        "sim-replica", "--engine", "vllm", "--data-parallel-size", "3", "--kv-events-config", json.dumps(config)
    )
    sources = httpx.get(sim.url + "/kv_event_sources").json()
    assert sorted(sources) == ["0", "1", "2"]
    assert [sources[r]["endpoint"] for r in "012"] == [f"tcp://*:{port + r}" for r in range(3)]
    assert [sources[r]["replay_endpoint"] for r in "012"] == [f"tcp://*:{replay + r}" for r in range(3)]


def test_a_request_goes_to_the_rank_it_names_and_only_that_rank_publishes_it(
    two_ranks: tuple[RunningProcess, int],
) -> None:
    sim, port = two_ranks
    subscribers = [Subscriber(f"tcp://127.0.0.1:{port + rank}") for rank in range(2)]
    try:
        for subscriber in subscribers:
            sync_by_flush(sim, subscriber)
        before = requests_per_rank(sim)
        chat(sim, "named by body " + PROMPT, data_parallel_rank=1).raise_for_status()
        chat(sim, "named by the newer field " + PROMPT, routed_dp_rank=1).raise_for_status()
        chat(sim, "named by header " + PROMPT, headers={"X-Data-Parallel-Rank": "1"}, routed_dp_rank=0)
        after = requests_per_rank(sim)
        assert [a - b for a, b in zip(after, before, strict=True)] == [0, 3]
        for subscriber in subscribers:
            subscriber.drain(0.3)
        stored = [
            [event for _, _, batch in s.batches for event in batch[1] if event["type"] == "BlockStored"]
            for s in subscribers
        ]
        assert not stored[0] and len(stored[1]) >= 3
        assert {batch[2] for _, _, batch in subscribers[1].batches} == {1}, "rank 1 stamps its batches with 1"
    finally:
        for subscriber in subscribers:
            subscriber.close()


def test_ranks_take_turns_and_keep_their_own_caches(two_ranks: tuple[RunningProcess, int]) -> None:
    sim, _ = two_ranks
    before = requests_per_rank(sim)
    cached = [chat(sim, "turns " + PROMPT).json()["usage"]["prompt_tokens_details"]["cached_tokens"] for _ in range(4)]
    after = requests_per_rank(sim)
    assert [a - b for a, b in zip(after, before, strict=True)] == [2, 2]
    assert cached[0] < 50 and cached[1] < 50, "the second request went to the other rank, which held only the template"
    assert min(cached[2:]) > 200, "each rank then holds the prompt"


def test_a_rank_that_is_not_there_or_not_a_number_is_refused(two_ranks: tuple[RunningProcess, int]) -> None:
    """As SGLang 0.5.23 with ``--dp-size 2`` answered on the CPU tier."""
    sim, _ = two_ranks
    refused = chat(sim, data_parallel_rank=2)
    assert refused.status_code == 400
    assert refused.json() == {
        "object": "error",
        "message": "routed_dp_rank=2 out of range [0, 2)",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
    refused = chat(sim, headers={"X-Data-Parallel-Rank": "one"})
    assert refused.status_code == 400
    assert refused.json() == {
        "object": "error",
        "message": "Invalid X-Data-Parallel-Rank header: must be an integer, got 'one'",
        "type": "400",
        "param": None,
        "code": 400,
    }
