"""Exact prefix routing over data-parallel replicas, through the real gateway and simulated SGLang replicas started
with ``--dp-size 2``: each rank keeps its own KV cache (small enough that the workload evicts) and publishes its
events on the configured port + its rank. The gateway follows every rank, predicts each request's cached tokens
on the rank it sends it to, and keeps each rank's record whole through a lost batch and a restart."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import zmq

from spillgate.backends.sim.prompt_encoder import SimulatedPromptIds
from tests.gateway.test_kv_events import conversation
from tests.support.gateway import TENANT_KEY, gateway_config, replica_name, start_gateway, start_replica
from tests.support.procs import RunningProcess, free_ports

BLOCK = 64
RANKS = 2


@dataclass
class Replica:
    process: RunningProcess
    args: tuple[str, ...]
    publish_port: int
    replay_port: int

    @property
    def name(self) -> str:
        return replica_name(self.process)

    def restart(self, log_dir: Path) -> None:
        port = int(self.process.url.rsplit(":", 1)[1])
        self.process.stop()
        self.process = start_replica(log_dir, *self.args, port=port)


def dp_replica(log_dir: Path, engine: str = "sglang") -> Replica:
    """A simulated replica of two ranks, each with 3,000 tokens of KV cache, publishing with a replay socket."""
    publish, replay = free_ports(RANKS), free_ports(RANKS)
    if engine == "vllm":
        config: dict[str, Any] = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{publish}"}
        config["replay_endpoint"] = f"tcp://*:{replay}"
        args: tuple[str, ...] = ("--engine", "vllm", "--data-parallel-size", str(RANKS))
    else:
        config = {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{publish}", "bind": True}
        config["replay_endpoint"] = f"tcp://127.0.0.1:{replay}"
        args = ("--dp-size", str(RANKS))
    args = (*args, "--time-scale", "0.02", "--max-total-tokens", "3000", "--kv-events-config", json.dumps(config))
    return Replica(start_replica(log_dir, *args), args, publish, replay)


def dp_gateway(log_dir: Path, replicas: list[Replica], engine: str = "sglang", **pool: Any) -> RunningProcess:
    config = gateway_config([r.process.url for r in replicas])
    config["pools"][0].update({"engine": engine, "prefill_tokens_per_s": 1_000_000, **pool})
    config["prefix"] = {"tokenizer": "simulated", "block_tokens": BLOCK}
    # The load guard stays out of these tests: a CPU stall on a busy test machine can make one replica's learned
    # TTFT overhead look twice the other's, and the guard would then move a turn away from its cache.
    patient = {"max_slowdown": 1000}
    config["routes"].append({"name": "aware", "targets": ["pool"], "policy": "cache_aware", "affinity": patient})
    return start_gateway(config, log_dir)


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningProcess, list[Replica], Path]]:
    """Two replicas of two ranks each: SGLang's (told the rank in the body) or vLLM's (in a header)."""
    log_dir: Path = tmp_path_factory.mktemp(f"kv-dp-{request.param}")
    replicas = [dp_replica(log_dir, request.param) for _ in range(2)]
    gateway = dp_gateway(log_dir, replicas, request.param)
    yield gateway, replicas, log_dir
    gateway.stop()
    for replica in replicas:
        replica.process.stop()


def prefix_health(gateway: RunningProcess) -> dict[str, dict[str, Any]]:
    body = httpx.get(gateway.url + "/health").json()
    return {name: b["prefix"] for name, b in body["backends"].items() if "prefix" in b}


def wait_until_every_rank_is_followed(gateway: RunningProcess, timeout: float = 20.0) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        seen = prefix_health(gateway)
        ranks = [rank for prefix in seen.values() for rank in prefix.get("dp_ranks", ())]
        followed = seen and len(ranks) == RANKS * len(seen) and all(r["complete"] and r["caught_up"] for r in ranks)
        if followed and all(prefix["source"] == "events" for prefix in seen.values()):
            return seen
        assert time.monotonic() < deadline, f"ranks not all followed: {seen}"
        # vLLM publishes nothing before a rank's first request: short ones, placed by the engine, give each one.
        client(gateway).chat.completions.create(
            model="chat-rr", messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
        time.sleep(0.2)


def wait_until_healthy(gateway: RunningProcess, name: str, timeout: float = 20.0) -> None:
    """A replica stopped for a restart is marked down; requests before the gateway's next probe would get 503."""
    deadline = time.monotonic() + timeout
    while not httpx.get(gateway.url + "/health").json()["backends"][name]["healthy"]:
        assert time.monotonic() < deadline, f"{name} not healthy again after its restart"
        time.sleep(0.1)


def outcomes(gateway: RunningProcess) -> dict[str, int]:
    totals = {"exact": 0, "over": 0, "under": 0}
    for prefix in prefix_health(gateway).values():
        for outcome, count in prefix["predictions"].get("events", {}).items():
            totals[outcome] += count
    return totals


def added(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {outcome: after[outcome] - before[outcome] for outcome in after}


def rank_loads(replica: Replica) -> list[dict[str, Any]]:
    return httpx.get(replica.process.url + "/sim/dp_ranks").json()


def client(gateway: RunningProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)


def test_every_rank_is_followed_at_its_own_port(world: tuple[RunningProcess, list[Replica], Path]) -> None:
    gateway, replicas, _ = world
    seen = wait_until_every_rank_is_followed(gateway)
    for replica in replicas:
        ranks = seen[replica.name]["dp_ranks"]
        assert [r["rank"] for r in ranks] == list(range(RANKS))
        assert [r["endpoint"] for r in ranks] == [f"tcp://127.0.0.1:{replica.publish_port + r}" for r in range(RANKS)]
        assert [r["replay"] for r in ranks] == [f"tcp://127.0.0.1:{replica.replay_port + r}" for r in range(RANKS)]
        assert seen[replica.name]["events"]["endpoint"] == ranks[0]["endpoint"]
    capabilities = httpx.get(gateway.url + "/health").json()["backends"][replicas[0].name]["capabilities"]
    assert capabilities["dp_size"] == RANKS


def test_a_conversation_continues_on_the_rank_holding_it(world: tuple[RunningProcess, list[Replica], Path]) -> None:
    """Each rank's cache is its own: a request sent to any other rank than its conversation's finds nothing there.
    Turns of one conversation in a row reach the same replica; the engine's own round robin would send every other
    one to the other rank."""
    gateway, replicas, _ = world
    wait_until_every_rank_is_followed(gateway)
    chat = client(gateway)
    before = [rank["requests"] for replica in replicas for rank in rank_loads(replica)]
    turns = [(group, 0) for group in range(100, 104)] + [(group, t) for group in (103, 101, 100, 102) for t in (1, 2)]
    for group, turn in turns:
        raw = chat.chat.completions.with_raw_response.create(
            model="aware", messages=conversation(group, turn), max_tokens=2
        )
        usage = raw.parse().usage
        assert usage is not None and usage.prompt_tokens_details is not None
        if turn:
            assert raw.headers["x-spillgate-reason"] == "prefix_hit"
            assert usage.prompt_tokens_details.cached_tokens > 1000, (group, turn, usage)
        time.sleep(0.05)
    after = [rank["requests"] for replica in replicas for rank in rank_loads(replica)]
    assert sum(1 for old, new in zip(before, after, strict=True) if new > old) >= 3, "the groups spread over ranks"


def test_predictions_are_exact_through_evictions(world: tuple[RunningProcess, list[Replica], Path]) -> None:
    gateway, replicas, _ = world
    wait_until_every_rank_is_followed(gateway)
    before = outcomes(gateway)
    chat = client(gateway)
    for round_ in range(3):
        for group in range(12):
            chat.chat.completions.create(model="aware", messages=conversation(group, round_), max_tokens=2)
            time.sleep(0.05)  # the replica's events for this answer arrive before the next request is decided
    counts = added(before, outcomes(gateway))
    assert sum(counts.values()) >= 30, counts
    assert counts["exact"] >= 0.99 * sum(counts.values()), counts
    loads = [rank for replica in replicas for rank in rank_loads(replica)]
    assert all(rank["requests"] > 0 for rank in loads), "every rank of every replica took requests"
    sent = sum(len(SimulatedPromptIds().chat(conversation(group, 2))) for group in range(12))
    assert sum(rank["cached_tokens"] for rank in loads) < sent, "the workload must evict"


@pytest.fixture(scope="module")
def relayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningProcess, Replica, Relay]]:
    """One replica whose events the gateway reads through a relay that can lose a rank's batch, at an endpoint
    the pool's ``kv_events`` template gives (the rank count still comes from the replica)."""
    log_dir: Path = tmp_path_factory.mktemp("kv-dp-relay")
    replica = dp_replica(log_dir)
    relay = Relay(replica.publish_port, free_ports(RANKS))
    gateway = dp_gateway(
        log_dir,
        [replica],
        kv_events={
            "endpoint": f"tcp://{{host}}:{relay.port}",
            "replay_endpoint": f"tcp://{{host}}:{replica.replay_port}",
        },
    )
    yield gateway, replica, relay
    gateway.stop()
    relay.stop()
    replica.process.stop()


class Relay:
    """Passes each rank's batches from the replica's publisher at ``source`` + rank to ``port`` + rank, losing the
    next batch of a rank when told to (:meth:`lose_next`)."""

    def __init__(self, source: int, port: int) -> None:
        self.port = port
        self._context = zmq.Context()
        self._subs, self._pubs = [], []
        for rank in range(RANKS):
            sub = self._context.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(f"tcp://127.0.0.1:{source + rank}")
            pub = self._context.socket(zmq.PUB)
            pub.bind(f"tcp://127.0.0.1:{port + rank}")
            self._subs.append(sub)
            self._pubs.append(pub)
        self._lose: set[int] = set()
        self.lost: list[tuple[int, int]] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._pass, daemon=True)
        self._thread.start()

    def lose_next(self, rank: int) -> None:
        self._lose.add(rank)

    def _pass(self) -> None:
        poller = zmq.Poller()
        for sub in self._subs:
            poller.register(sub, zmq.POLLIN)
        while not self._stopping.is_set():
            for sub, _ in poller.poll(100):
                rank = self._subs.index(sub)
                frames = sub.recv_multipart()
                if rank in self._lose:
                    self._lose.discard(rank)
                    self.lost.append((rank, int.from_bytes(frames[1], "big")))
                    continue
                self._pubs[rank].send_multipart(frames)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        for sock in (*self._subs, *self._pubs):
            sock.close(0)
        self._context.term()


def test_a_lost_batch_of_one_rank_is_replayed_for_that_rank_alone(
    relayed: tuple[RunningProcess, Replica, Relay],
) -> None:
    gateway, replica, relay = relayed
    seen = wait_until_every_rank_is_followed(gateway)
    ranks = seen[replica.name]["dp_ranks"]
    assert [r["endpoint"] for r in ranks] == [f"tcp://127.0.0.1:{relay.port + r}" for r in range(RANKS)]
    chat = client(gateway)
    chat.chat.completions.create(model="aware", messages=conversation(60, 0), max_tokens=2)
    chat.chat.completions.create(model="aware", messages=conversation(61, 0), max_tokens=2)
    time.sleep(0.3)
    relay.lose_next(1)
    before = outcomes(gateway)
    for round_ in range(1, 3):
        for group in range(62, 66):
            chat.chat.completions.create(model="aware", messages=conversation(group, round_ - 1), max_tokens=2)
            time.sleep(0.05)
        for group in (60, 61):
            chat.chat.completions.create(model="aware", messages=conversation(group, round_), max_tokens=2)
            time.sleep(0.05)
    assert [rank for rank, _ in relay.lost] == [1], relay.lost
    ranks = prefix_health(gateway)[replica.name]["dp_ranks"]
    assert [r["gaps"] for r in ranks] == [0, 1], ranks
    assert all(r["complete"] for r in ranks), "the replay filled the gap"
    counts = added(before, outcomes(gateway))
    assert counts["exact"] == sum(counts.values()) >= 10, counts


def test_a_restarted_replica_holds_nothing_on_any_rank(relayed: tuple[RunningProcess, Replica, Relay]) -> None:
    gateway, replica, _ = relayed
    wait_until_every_rank_is_followed(gateway)
    chat = client(gateway)
    for group in (70, 71):
        chat.chat.completions.create(model="aware", messages=conversation(group, 0), max_tokens=2)
    time.sleep(0.3)
    assert all(rank["cached_tokens"] > 1000 for rank in rank_loads(replica)), "each rank holds one conversation"
    last = [r["last_seq"] for r in prefix_health(gateway)[replica.name]["dp_ranks"]]
    replica.restart(replica.process.log_path.parent)
    wait_until_healthy(gateway, replica.name)
    deadline = time.monotonic() + 30
    while True:
        ranks = prefix_health(gateway)[replica.name]["dp_ranks"]
        if all(r["last_seq"] is not None and r["last_seq"] < old for r, old in zip(ranks, last, strict=True)):
            break
        assert time.monotonic() < deadline, f"the new process's batches not heard: {ranks}"
        # Short prompts, each rank in turn, that the new process publishes (its first batch may go unheard).
        chat.chat.completions.create(model="aware", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
        time.sleep(0.2)
    wait_until_every_rank_is_followed(gateway)
    before = outcomes(gateway)
    for group in (70, 71):
        usage = chat.chat.completions.create(model="aware", messages=conversation(group, 1), max_tokens=2).usage
        assert usage is not None and usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens < BLOCK
    assert added(before, outcomes(gateway)) == {"exact": 2, "over": 0, "under": 0}
