"""Exact prefix routing from the replicas' own KV-cache events, through the real gateway and simulated replicas
that publish events as SGLang and vLLM do, with a KV cache small enough that the workload evicts."""

from __future__ import annotations

import asyncio
import json
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import zmq.asyncio

from spillgate.backends.kv_subscriber import KvEventSource, KvSubscriber
from spillgate.backends.sim.prompt_encoder import SimulatedPromptIds
from spillgate.cache.fingerprint import cache_seed, token_block_hashes
from spillgate.gateway.dispatch.prefix import PrefixTracker
from tests.support.gateway import TENANT_KEY, gateway_config, replica_name, start_gateway, start_replica
from tests.support.procs import RunningProcess, free_port

BLOCK = 64


def publishing_replica(log_dir: Path, engine: str) -> tuple[RunningProcess, KvEventSource]:
    """A simulated replica of ``engine`` with 4,000 tokens of KV cache (the workload's conversations, about 1,300
    tokens each, do not all fit), publishing its KV events; returns it and where it publishes."""
    port, replay = free_port(), free_port()
    if engine == "vllm":
        config = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}", "replay_endpoint": f"tcp://*:{replay}"}
        flags = ["--engine", "vllm", "--kv-events-config", json.dumps(config)]
    else:
        config = {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port}", "bind": True, "topic": "kv"}
        flags = ["--kv-events-config", json.dumps({**config, "replay_endpoint": f"tcp://127.0.0.1:{replay}"})]
    replica = start_replica(log_dir, "--time-scale", "0.02", "--max-total-tokens", "4000", *flags)
    return replica, KvEventSource(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}", "")


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    log_dir: Path = tmp_path_factory.mktemp(f"kv-{request.param}")
    started = [publishing_replica(log_dir, request.param) for _ in range(2)]
    replicas = [replica for replica, _ in started]
    config = gateway_config([r.url for r in replicas])
    config["pools"][0]["engine"] = request.param
    config["pools"][0]["prefill_tokens_per_s"] = 1_000_000
    config["prefix"] = {"tokenizer": "simulated", "block_tokens": BLOCK}
    # The load guard stays out of these tests: a CPU stall on a busy test machine can make one replica's learned
    # TTFT overhead look twice the other's, and the guard would then move a turn away from its cache.
    patient = {"max_slowdown": 1000}
    config["routes"].append({"name": "aware", "targets": ["pool"], "policy": "cache_aware", "affinity": patient})
    gateway = start_gateway(config, log_dir)
    yield World(gateway, replicas, [source for _, source in started], config, log_dir)
    gateway.stop()
    for replica in replicas:
        replica.stop()


@dataclass
class World:
    gateway: RunningProcess
    replicas: list[RunningProcess]
    sources: list[KvEventSource]
    config: dict
    log_dir: Path


def replica_health(gateway: RunningProcess) -> dict[str, dict]:
    body = httpx.get(gateway.url + "/health").json()
    return {name: b for name, b in body["backends"].items() if "prefix" in b}


def wait_until_followed(gateway: RunningProcess) -> None:
    """Until every replica's events are followed from its first batch (a vLLM face publishes nothing before its
    first request: requests in turn give each one)."""
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    deadline = time.monotonic() + 20
    while True:
        sources = {name: b["prefix"]["source"] for name, b in replica_health(gateway).items()}
        if sources and set(sources.values()) == {"events"}:
            return
        assert time.monotonic() < deadline, f"replicas not followed: {sources}"
        client.chat.completions.create(model="chat-rr", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
        time.sleep(0.2)


def conversation(group: int, turns: int) -> list[dict[str, str]]:
    messages = [
        {"role": "system", "content": f"Group {group} manual. " + " ".join(f"rule{group}x{i}." for i in range(300))}
    ]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn} about item {group * 7 + turn}"})
        messages.append({"role": "assistant", "content": f"answer {turn}"})
    return messages


def test_predicted_cached_tokens_match_the_replicas_reports_through_evictions(world: World) -> None:
    gateway = world.gateway
    wait_until_followed(gateway)
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    for round_ in range(3):
        for group in range(8):
            client.chat.completions.create(model="aware", messages=conversation(group, round_), max_tokens=2)
            time.sleep(0.05)  # the replica's events for this answer arrive before the next request is decided
    predictions = {name: b["prefix"]["predictions"].get("events", {}) for name, b in replica_health(gateway).items()}
    total = sum(sum(counts.values()) for counts in predictions.values())
    exact = sum(counts.get("exact", 0) for counts in predictions.values())
    assert total >= 20, predictions
    assert exact >= 0.99 * total, predictions
    unused = [b["prefix"]["predictions"].get("belief_unused", {}) for b in replica_health(gateway).values()]
    assert sum(sum(counts.values()) for counts in unused) == total, "the belief's figure on the same requests"
    scraped = httpx.get(gateway.url + "/metrics").text
    first = replica_name(world.replicas[0])
    assert f'spillgate_prefix_predictions{{backend="{first}",outcome="exact",source="events"}}' in scraped


def test_a_chat_ending_with_a_long_assistant_message_is_predicted_exactly(world: World) -> None:
    """SGLang renders a chat's final assistant message as the user's, vLLM as the assistant's: the gateway renders
    as the route's engine does, so the second of two such requests is predicted as the replica then reports it
    (rendered the other way, the blocks after the last user turn would be predicted and not found)."""
    gateway = world.gateway
    wait_until_followed(gateway)
    messages = [*conversation(40, 1)[:-1], {"role": "assistant", "content": " ".join(f"d{i}" for i in range(300))}]
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    before = replica_health(gateway)
    for _ in range(2):
        client.chat.completions.create(model="aware", messages=messages, max_tokens=2)
        time.sleep(0.1)
    after = replica_health(gateway)
    added = {
        outcome: sum(
            b["prefix"]["predictions"].get("events", {}).get(outcome, 0)
            - before[name]["prefix"]["predictions"].get("events", {}).get(outcome, 0)
            for name, b in after.items()
        )
        for outcome in ("exact", "over", "under")
    }
    assert added == {"exact": 2, "over": 0, "under": 0}, after


async def test_the_index_holds_what_each_replicas_cache_holds(world: World) -> None:
    """A subscription of this process's own, joining late and catching up from the replay socket, predicts every
    sequence each replica's radix cache holds in full after a workload that evicts, and nothing for a prompt it
    never saw."""
    tracker = PrefixTracker(block_chars=256, max_blocks=512, tokenizer=SimulatedPromptIds(), block_tokens=BLOCK)
    context = zmq.asyncio.Context()
    subscribers = []
    for index, source in enumerate(world.sources):
        tracker.follow(f"r{index}")
        subscriber = KvSubscriber(f"r{index}", source, tracker, context)
        subscriber.start()
        subscribers.append(subscriber)
    try:
        await asyncio.sleep(0.5)  # subscribed before the workload starts
        async with openai.AsyncOpenAI(base_url=world.gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0) as client:
            for group in range(20, 30):
                await client.chat.completions.create(model="aware", messages=conversation(group, 1), max_tokens=2)
        ids = SimulatedPromptIds()
        sent = sum(len(ids.chat(conversation(group, 1))) for group in range(20, 30))
        cached = 0
        async with httpx.AsyncClient() as http:
            for index, replica in enumerate(world.replicas):
                cache = (await http.get(replica.url + "/sim/radix_cache")).json()
                cached += cache["total_tokens"]
                deadline = time.monotonic() + 10
                while subscribers[index].last_seq != cache["kv_events_next_seq"] - 1:
                    assert time.monotonic() < deadline, "events not all received"
                    await asyncio.sleep(0.05)
                held = 0
                for namespace in cache["namespaces"]:
                    seed = cache_seed(namespace["cache_salt"])
                    for sequence in namespace["sequences"]:
                        hashes = token_block_hashes(array("I", sequence), seed, block_tokens=BLOCK, max_blocks=512)
                        assert tracker.exact.match(hashes, [f"r{index}"]) == {f"r{index}": len(hashes)}
                        held += len(hashes)
                assert held > 0
                assert tracker.exact.blocks_held(f"r{index}") >= held
                unseen = token_block_hashes(
                    array("I", range(1000, 1640)), cache_seed(None), block_tokens=BLOCK, max_blocks=512
                )
                assert tracker.exact.match(unseen, [f"r{index}"]) == {f"r{index}": 0}
        assert cached < sent, "the workload must evict"
    finally:
        for subscriber in subscribers:
            await subscriber.stop()
        context.term()


def test_a_second_gateway_process_sees_what_the_first_sent_without_sharing_anything(world: World) -> None:
    """Two processes, no Redis: each follows every replica's events, so a conversation begun through one continues
    on the same replica through the other, predicted exactly."""
    wait_until_followed(world.gateway)
    other = start_gateway(world.config, world.log_dir)
    try:
        wait_until_followed(other)
        first = openai.OpenAI(base_url=world.gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
        second = openai.OpenAI(base_url=other.url + "/v1", api_key=TENANT_KEY, max_retries=0)
        for group in range(40, 44):
            raw = first.chat.completions.with_raw_response.create(
                model="aware", messages=conversation(group, 0), max_tokens=2
            )
            home = raw.headers["x-spillgate-backend"]
            time.sleep(0.1)
            raw = second.chat.completions.with_raw_response.create(
                model="aware", messages=conversation(group, 1), max_tokens=2
            )
            assert (raw.headers["x-spillgate-backend"], raw.headers["x-spillgate-reason"]) == (home, "prefix_hit")
            assert raw.headers["x-spillgate-prefix-source"] == "events"
            assert raw.parse().usage.prompt_tokens_details.cached_tokens > 1000
        counts = [b["prefix"]["predictions"].get("events", {}) for b in replica_health(other).values()]
        assert sum(c.get("exact", 0) for c in counts) == sum(sum(c.values()) for c in counts) > 0, counts
    finally:
        other.stop()
