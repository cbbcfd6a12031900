"""The simulator's KV-cache events (``--kv-events-config``) held to the real publishers and to its own cache.

The captured batches (``tests/fixtures/<engine>/recommended/kv_events.json``) fix the frames, the keys, their
types and the hashes' signedness; SGLang's hash chain is recomputed from the fixture's own token ids. A subscriber
that applies every event to a plain model of block chains must end up holding exactly what the radix cache holds,
per cache salt, through eviction, prefix sharing and salts. The replay socket returns what a late subscriber
missed, and a restarted simulator numbers its batches from 0 again, starting with ``AllBlocksCleared``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import zmq
import zmq.asyncio

from spillgate.backends.sim import cli
from spillgate.backends.sim.engine import cache_namespace
from spillgate.backends.sim.kv_events import (
    END_SEQ,
    KvEventPublisher,
    parse_kv_events_config,
    sglang_page_digests,
    sglang_published,
    sglang_salt_seed,
    split_namespace,
)
from spillgate.backends.sim.radix_cache import RadixCache
from tests.sim.conftest import StartReplica
from tests.sim.helpers import distinct_ids
from tests.support.procs import RunningProcess, free_port, start_spillgate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EVENT_KEYS = ("type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")
INT64 = (-(2**63), 2**63)
UINT64 = (0, 2**64)


def fixture_batches(engine: str) -> list[dict[str, Any]]:
    return json.loads((FIXTURES / engine / "recommended" / "kv_events.json").read_text())["batches"]


def sglang_config(port: int, **extra: Any) -> str:
    return json.dumps({"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv", "bind": True, **extra})


def vllm_config(port: int, **extra: Any) -> str:
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv"}
    return json.dumps({**config, **extra})


# a subscriber and a model of what it learns ---------------------------------------------------------------------


class Subscriber:
    """A plain ZMQ SUB socket collecting ``(topic, seq, batch)``; it binds when the publisher connects (vLLM)."""

    def __init__(self, endpoint: str, *, bind: bool = False) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(endpoint) if bind else self.socket.connect(endpoint)
        self.frames: list[list[bytes]] = []

    @property
    def batches(self) -> list[tuple[bytes, int, list[Any]]]:
        return [(f[0], int.from_bytes(f[1], "big"), msgspec.msgpack.decode(f[2])) for f in self.frames]

    def drain(self, wait_s: float = 0.2) -> None:
        while self.socket.poll(int(wait_s * 1000)):
            self.frames.append(self.socket.recv_multipart())

    def until(self, done: Callable[[], bool], timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"gave up waiting; got seqs {[b[1] for b in self.batches]}"
            self.drain(0.1)

    def close(self) -> None:
        self.socket.close(0)
        self.context.term()


def sync_by_flush(sim: RunningProcess, sub: Subscriber) -> None:
    """Flush the (idle) SGLang cache until the subscriber hears the AllBlocksCleared, so it misses nothing after."""

    start = len(sub.frames)

    def heard() -> bool:
        return any(e["type"] == "AllBlocksCleared" for _, _, batch in sub.batches[start:] for e in batch[1])

    deadline = time.monotonic() + 15
    while not heard():
        assert time.monotonic() < deadline, "the subscriber never heard the publisher"
        httpx.post(sim.url + "/flush_cache", timeout=10).raise_for_status()
        sub.drain(0.2)


class BlockChains:
    """What a subscriber knows after applying events: each block's parent, tokens and cache salt."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.blocks: dict[int, tuple[int | None, tuple[int, ...], str | None]] = {}
        self.removed = 0
        self.salts: set[str | None] = set()

    def apply(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "AllBlocksCleared":
            self.blocks.clear()
        elif kind == "BlockRemoved":
            for block in event["block_hashes"]:
                assert block in self.blocks, f"removing unknown block {block}"
                del self.blocks[block]
                self.removed += 1
        else:
            assert kind == "BlockStored", event
            size, tokens, hashes = event["block_size"], event["token_ids"], event["block_hashes"]
            assert hashes and len(tokens) == size * len(hashes), event
            parent = event["parent_block_hash"]
            salt = self._salt(event) if parent is None else self.blocks[parent][2]
            if self.engine == "sglang":
                assert event.get("cache_salt") == salt, event
            self.salts.add(salt)
            for i, block in enumerate(hashes):
                assert block not in self.blocks, f"block {block} stored twice"
                self.blocks[block] = (parent, tuple(tokens[i * size : (i + 1) * size]), salt)
                parent = block

    def _salt(self, event: dict[str, Any]) -> str | None:
        if self.engine == "sglang":
            return event.get("cache_salt")
        first = event["extra_keys"][0]
        assert all(key is None for key in event["extra_keys"][1:])
        return first[0] if first else None

    def chains(self) -> dict[str | None, list[tuple[list[int], list[int]]]]:
        """Per salt, each root-to-leaf chain: its tokens and its block hashes."""
        parents = {parent for parent, _, _ in self.blocks.values()}
        found: dict[str | None, list[tuple[list[int], list[int]]]] = {}
        for leaf in self.blocks.keys() - parents:
            hashes, tokens, block = [], [], leaf
            while block is not None:
                parent, page, salt = self.blocks[block]
                hashes.append(block)
                tokens[:0] = page
                block = parent
            found.setdefault(salt, []).append((tokens, hashes[::-1]))
        return found

    def sequences(self) -> dict[str | None, list[list[int]]]:
        return {salt: sorted(tokens for tokens, _ in chains) for salt, chains in self.chains().items()}

    def check_sglang_hashes(self, page_size: int) -> None:
        """Every chain's hashes are SGLang's SHA-256 chain over its tokens, seeded by its salt."""
        for salt, chains in self.chains().items():
            seed = sglang_salt_seed(salt) if salt is not None else None
            for tokens, hashes in chains:
                assert [sglang_published(d) for d in sglang_page_digests(seed, tokens, page_size)] == hashes


def cache_content(sim: RunningProcess) -> dict[str, Any]:
    return httpx.get(sim.url + "/sim/radix_cache", timeout=10).json()


def sequences_by_salt(content: dict[str, Any]) -> dict[str | None, list[list[int]]]:
    found: dict[str | None, list[list[int]]] = {}
    for space in content["namespaces"]:
        assert space["extra_key"] is None
        found[space["cache_salt"]] = sorted(space["sequences"])
    return found


# (e) SGLang's hash chain --------------------------------------------------------------------------------------


def test_sglang_hash_chain_reproduces_the_real_engines_hashes() -> None:
    """Page size 1, no salt: each batch's hashes follow from its token ids and the previous page's digest."""
    digests: dict[int, bytes] = {}
    checked = 0
    for record in fixture_batches("sglang"):
        for event in record["batch"][1]:
            if event["type"] != "BlockStored":
                continue
            assert event["block_size"] == 1
            parent = event["parent_block_hash"]
            chain = sglang_page_digests(None if parent is None else digests[parent], event["token_ids"], 1)
            assert [sglang_published(d) for d in chain] == event["block_hashes"]
            digests.update((sglang_published(d), d) for d in chain)
            checked += len(chain)
    assert checked >= 20


# the flag -----------------------------------------------------------------------------------------------------


def _replica_args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_replica_arguments(parser)
    return parser.parse_args(["--port", "9", *flags])


@pytest.mark.parametrize(
    ("engine", "text", "problem"),
    [
        ("sglang", "{publisher: zmq}", "not JSON"),
        ("sglang", "[1]", "must be a JSON object"),
        ("sglang", '{"publisher": "kafka"}', "publisher"),
        ("sglang", '{"publisher": "zmq", "endpoint": "tcp://127.0.0.1"}', "endpoint"),
        ("vllm", '{"enable_kv_cache_events": true, "bind": true}', "bind"),
        ("vllm", '{"enable_kv_cache_events": "maybe"}', "enable_kv_cache_events"),
        ("sglang", '{"publisher": "zmq", "hwm": -1}', "hwm"),
    ],
)
def test_a_bad_config_stops_the_start_with_the_reason(
    engine: str, text: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _replica_args("--engine", engine, "--kv-events-config", text)
    assert cli.run_replica(args) == 2
    error = capsys.readouterr().err
    assert "--kv-events-config" in error and problem in error, error


def test_the_config_binds_or_connects_as_each_engine_does() -> None:
    def binds(engine: str, config: dict[str, Any]) -> bool:
        parsed = parse_kv_events_config(engine, json.dumps(config))
        assert parsed is not None
        return parsed.bind

    local = "tcp://127.0.0.1:5557"
    assert not binds("sglang", {"publisher": "zmq", "endpoint": local})
    assert binds("sglang", {"publisher": "zmq", "endpoint": local, "bind": True})
    assert binds("sglang", {"publisher": "zmq", "endpoint": "tcp://*:5557"})
    assert binds("sglang", {"publisher": "zmq", "endpoint": "tcp://0.0.0.0:5557"})
    assert not binds("vllm", {"enable_kv_cache_events": True, "endpoint": local})
    assert binds("vllm", {"enable_kv_cache_events": True, "endpoint": "tcp://*:5557"})
    assert binds("vllm", {"enable_kv_cache_events": True, "endpoint": "tcp://[::]:5557"})
    assert binds("vllm", {"enable_kv_cache_events": True, "endpoint": "ipc:///tmp/kv"})
    # SGLang's default publisher is "null"; vLLM's follows enable_kv_cache_events.
    assert not parse_kv_events_config("sglang", "{}").publishes  # type: ignore[union-attr]
    assert not parse_kv_events_config("vllm", '{"publisher": "zmq"}').publishes  # type: ignore[union-attr]
    assert parse_kv_events_config("vllm", '{"enable_kv_cache_events": true}').publisher == "zmq"  # type: ignore[union-attr]
    assert cli.replica_config_from_args(_replica_args()).kv_events is None


# (a) frames, keys, types and signedness as captured -------------------------------------------------------------


def _check_batch(frames: list[bytes], real: dict[str, Any]) -> list[dict[str, Any]]:
    assert len(frames) == 3
    topic, seq, payload = frames
    assert topic == real["topic"].encode() and len(seq) == 8
    batch = msgspec.msgpack.decode(payload)
    rank = real["batch"][2]
    assert isinstance(batch, list) and len(batch) == 3
    assert isinstance(batch[0], float) and isinstance(batch[1], list) and batch[2] == rank
    assert abs(batch[0] - time.time()) < 60
    return batch[1]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_batches_have_the_captured_frames_keys_types_and_signedness(start_sim: StartReplica, engine: str) -> None:
    batches = fixture_batches(engine)
    real_stored = next(e for b in batches for e in b["batch"][1] if e["type"] == "BlockStored")
    port = free_port()
    base = ["--bare", "--preset", "tiny-test", "--time-scale", "0.02", "--engine", engine]
    if engine == "vllm":
        sub = Subscriber(f"tcp://127.0.0.1:{port}", bind=True)  # vLLM connects to an explicit host
        sim = start_sim("sim-replica", *base, "--kv-events-config", vllm_config(port))
        sub.drain(0.5)  # a SUB takes its connections in (and subscribes) only while it is used
    else:
        sim = start_sim("sim-replica", *base, "--kv-events-config", sglang_config(port))
        sub = Subscriber(f"tcp://127.0.0.1:{port}")
        sync_by_flush(sim, sub)
    try:
        start = len(sub.frames)
        body = {"prompt": distinct_ids(400, 11), "max_tokens": 4}
        httpx.post(sim.url + "/v1/completions", json=body, timeout=30).raise_for_status()
        sub.until(lambda: len(sub.frames) > start)
        sub.drain(0.3)
        stored = []
        for frames in sub.frames[start:]:
            events = _check_batch(frames, batches[0])
            stored += [e for e in events if e["type"] == "BlockStored"]
        assert stored
        hashes = [h for e in stored for h in e["block_hashes"]]
        for event in stored:
            assert list(event) == list(real_stored), "the keys (and their order) differ from the real engine's"
            for key, value in event.items():
                real = real_stored[key]
                if key == "extra_keys":  # one per block; None without a salt
                    assert len(value) == len(event["block_hashes"]) and set(value) == {None}
                elif key == "parent_block_hash":
                    assert value is None or type(value) is int
                elif isinstance(real, list):
                    assert isinstance(value, list) and all(type(v) is int for v in value), key
                elif key == "block_size":
                    assert type(value) is int
                else:  # type, lora_id, medium, lora_name, group_idx, kv_cache_spec_kind: the real values
                    assert value == real and type(value) is type(real), key
        low, high = INT64 if engine == "sglang" else UINT64
        assert all(low <= h < high for h in hashes)
        # SGLang's int64s are often negative; vLLM's unsigned ones often past 2**63.
        assert any(h < 0 for h in hashes) if engine == "sglang" else any(h >= 2**63 for h in hashes)
        assert stored[0]["block_size"] == (1 if engine == "sglang" else 16)
        assert stored[0]["medium"] == "GPU" and stored[0]["lora_id"] is None
    finally:
        sub.close()


def test_server_info_and_kv_event_sources_show_the_config_as_the_engines_do(start_sim: StartReplica) -> None:
    real_info = json.loads((FIXTURES / "sglang" / "recommended" / "server_info.json").read_text())["body"]
    real_sources = json.loads((FIXTURES / "vllm" / "recommended" / "kv_event_sources.json").read_text())["body"]
    port, replay = free_port(), free_port()
    config = sglang_config(port)
    sglang = start_sim("sim-replica", "--bare", "--time-scale", "0.02", "--kv-events-config", config)
    info = httpx.get(sglang.url + "/server_info", timeout=10).json()
    assert set(info["kv_events"]) == set(real_info["kv_events"])
    assert info["kv_events"] == {**real_info["kv_events"], "endpoint_port_base": port}
    assert info["kv_events_config"] == config
    config = sglang_config(free_port(), replay_endpoint=f"tcp://127.0.0.1:{replay}")
    sglang = start_sim("sim-replica", "--bare", "--time-scale", "0.02", "--kv-events-config", config)
    assert httpx.get(sglang.url + "/server_info", timeout=10).json()["kv_events"]["replay_endpoint_port_base"] == replay
    vllm = start_sim("sim-replica", "--bare", "--engine", "vllm", "--kv-events-config", vllm_config(port))
    sources = httpx.get(vllm.url + "/kv_event_sources", timeout=10).json()
    assert set(sources) == {"0"} and set(sources["0"]) == set(real_sources["0"])
    assert sources["0"] == {**real_sources["0"], "endpoint": f"tcp://127.0.0.1:{port}"}


# (b) the events rebuild the cache ---------------------------------------------------------------------------------


def _workload(seed: int) -> list[tuple[list[int], str | None, int]]:
    """Long prompts (prompt, cache salt, output tokens): distinct ones, ones sharing a prefix, salted and not."""
    a, c = distinct_ids(700, seed), distinct_ids(600, seed + 1)
    return [
        (a, None, 6),
        (a[:400] + distinct_ids(300, seed + 2), None, 9),
        (c, "tenant-a", 5),
        (c[:450] + distinct_ids(250, seed + 3), "tenant-a", 17),
        (a[:400] + distinct_ids(300, seed + 2), "tenant-b", 3),  # the same tokens as the second, another salt
        (distinct_ids(900, seed + 4), None, 4),
        (a, None, 8),  # back after eviction, or a hit
        (c, "tenant-a", 2),
        (distinct_ids(500, seed + 5), "tenant-b", 21),
    ]


def _send(sim: RunningProcess, engine: str, prompt: list[int], salt: str | None, out: int) -> None:
    extra = {"cache_salt": salt} if salt is not None else {}
    if engine == "vllm":
        body = {"prompt": prompt, "max_tokens": out, "ignore_eos": True, **extra}
        httpx.post(sim.url + "/v1/completions", json=body, timeout=60).raise_for_status()
    else:
        body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": out, "ignore_eos": True}, **extra}
        httpx.post(sim.url + "/generate", json=body, timeout=60).raise_for_status()


@pytest.mark.parametrize(("engine", "page_size"), [("sglang", 1), ("sglang", 8), ("vllm", 16)])
def test_applying_every_event_gives_exactly_what_the_cache_holds(
    start_sim: StartReplica, engine: str, page_size: int
) -> None:
    port = free_port()
    flags = ["--bare", "--preset", "tiny-test", "--time-scale", "0.02", "--max-total-tokens", "2048"]
    flags += ["--engine", engine, "--page-size", str(page_size)]
    if engine == "vllm":
        sub = Subscriber(f"tcp://127.0.0.1:{port}", bind=True)
        sim = start_sim("sim-replica", *flags, "--kv-events-config", vllm_config(port))
        sub.drain(0.5)  # a SUB takes its connections in (and subscribes) only while it is used
    else:
        sim = start_sim("sim-replica", *flags, "--kv-events-config", sglang_config(port))
        sub = Subscriber(f"tcp://127.0.0.1:{port}")
        sync_by_flush(sim, sub)
    try:
        for prompt, salt, out in _workload(seed=page_size):
            _send(sim, engine, prompt, salt, out)
        with ThreadPoolExecutor(4) as pool:  # running requests hold their prefixes while others evict
            burst = _workload(seed=100 + page_size)[:4]
            list(pool.map(lambda job: _send(sim, engine, *job), burst))
        content = cache_content(sim)
        last = content["kv_events_next_seq"] - 1
        sub.until(lambda: bool(sub.batches) and sub.batches[-1][1] >= last)
        seqs = [seq for _, seq, _ in sub.batches]
        assert seqs == list(range(seqs[0], last + 1)), "a batch was missed"
        if engine == "vllm":
            assert seqs[0] == 0  # vLLM publishes nothing at start: its first batch is the first store
        model = BlockChains(engine)
        for _, _, batch in sub.batches:
            for event in batch[1]:
                model.apply(event)
        assert model.removed > 0, "the workload should have evicted"
        assert model.salts == {None, "tenant-a", "tenant-b"}
        held = sequences_by_salt(content)
        assert len(held) >= 2
        assert model.sequences() == held
        if engine == "sglang":
            model.check_sglang_hashes(page_size)
    finally:
        sub.close()


@pytest.mark.parametrize(("engine", "page_size"), [("sglang", 1), ("sglang", 4), ("vllm", 16)])
def test_every_cache_change_is_published_in_order(engine: str, page_size: int) -> None:
    """The radix cache alone, driven at random (inserts, prefix matches that split edges, locks, evictions,
    resets): after each step the events published so far rebuild it exactly."""
    config = parse_kv_events_config(engine, vllm_config(1) if engine == "vllm" else sglang_config(1))
    assert config is not None
    publisher = KvEventPublisher(config, page_size)  # not started: batches only go to the replay buffer
    cache = RadixCache(page_size, events=publisher)
    rng = random.Random(page_size)
    stems = [distinct_ids(60, seed) for seed in range(4)]
    namespaces = [None, cache_namespace(None, "s1"), cache_namespace(None, "s2")]
    locked = []
    model = BlockChains(engine)
    applied = 0
    for step in range(400):
        tokens = rng.choice(stems)[: rng.randrange(0, 60)] + distinct_ids(rng.randrange(0, 40), rng.random())
        namespace = rng.choice(namespaces)
        roll = rng.random()
        if roll < 0.5:
            _, node = cache.insert(tokens, namespace)
            if rng.random() < 0.3:
                cache.lock(node)
                locked.append(node)
        elif roll < 0.75:
            cache.match_prefix(tokens, namespace)
        elif roll < 0.97:
            if locked and rng.random() < 0.5:
                cache.unlock(locked.pop(rng.randrange(len(locked))))
            cache.evict(rng.randrange(1, 200))
        elif not locked:
            cache.reset()
        publisher.flush()
        for seq, payload in publisher.retained(applied):
            applied = seq + 1
            for event in msgspec.msgpack.decode(payload)[1]:
                model.apply(event)
        held = {split_namespace(ns)[1]: sorted(cache.cached_sequences(ns)) for ns in cache.namespaces()}
        assert model.sequences() == held, f"step {step}"
    assert model.removed > 0
    if engine == "sglang":
        model.check_sglang_hashes(page_size)


# (c) replay -------------------------------------------------------------------------------------------------------


def replay(endpoint: str, start: int) -> list[list[bytes]]:
    """What a DEALER gets for ``[b"", start]``: the batches' frames, up to the end mark (kept last)."""
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        frames = []
        while True:
            assert dealer.poll(10_000), "the replay socket did not answer"
            frames.append(dealer.recv_multipart())
            if frames[-1][2] == END_SEQ:
                return frames
    finally:
        dealer.close(0)
        context.term()


def test_the_replay_socket_returns_the_batches_a_late_subscriber_missed(start_sim: StartReplica) -> None:
    port, replay_port = free_port(), free_port()
    replay_endpoint = f"tcp://127.0.0.1:{replay_port}"
    config = sglang_config(port, replay_endpoint=replay_endpoint)
    sim = start_sim(
        "sim-replica", "--bare", "--preset", "tiny-test", "--time-scale", "0.02", "--kv-events-config", config
    )
    for seed in range(3):  # published before anyone listens
        _send(sim, "sglang", distinct_ids(200, seed), None, 3)
    sub = Subscriber(f"tcp://127.0.0.1:{port}")
    try:
        sync_by_flush(sim, sub)
        _send(sim, "sglang", distinct_ids(200, 7), "s", 3)
        last = cache_content(sim)["kv_events_next_seq"] - 1
        sub.until(lambda: sub.batches[-1][1] == last)
        first_heard = sub.batches[0][1]
        assert first_heard > 3
        answer = replay(replay_endpoint, 0)
        assert answer[-1] == [b"", b"", END_SEQ, b""]
        assert all(len(frames) == 4 and frames[0] == b"" and frames[1] == b"kv" for frames in answer[:-1])
        seqs = [int.from_bytes(frames[2], "big") for frames in answer[:-1]]
        assert seqs == list(range(last + 1))
        first = msgspec.msgpack.decode(answer[0][3])[1]
        assert first == [{"type": "AllBlocksCleared"}]  # the empty cache at start-up
        heard = {seq: frames[2] for frames, (_, seq, _) in zip(sub.frames, sub.batches, strict=True)}
        assert all(answer[seq][3] == payload for seq, payload in heard.items())  # the same bytes
        later = replay(replay_endpoint, first_heard)
        assert [int.from_bytes(f[2], "big") for f in later[:-1]] == list(range(first_heard, last + 1))
        assert replay(replay_endpoint, last + 1) == [[b"", b"", END_SEQ, b""]]
    finally:
        sub.close()


async def test_replay_keeps_only_the_last_buffer_steps_batches() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    config = parse_kv_events_config("sglang", sglang_config(free_port(), replay_endpoint=endpoint, buffer_steps=3))
    assert config is not None
    publisher = KvEventPublisher(config, 1)
    await publisher.start()  # batch 0: AllBlocksCleared
    context = zmq.asyncio.Context()
    dealer = context.socket(zmq.DEALER)
    try:
        for _ in range(5):
            publisher.cleared()
            publisher.flush()
        dealer.connect(endpoint)
        await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        seqs = []
        while True:
            frames = await asyncio.wait_for(dealer.recv_multipart(), 10)
            if frames[2] == END_SEQ:
                break
            seqs.append(int.from_bytes(frames[2], "big"))
        assert seqs == [3, 4, 5]
    finally:
        dealer.close(0)
        context.term()
        await publisher.close()


# (d) a restart ----------------------------------------------------------------------------------------------------


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[RunningProcess]]:
    started: list[RunningProcess] = []
    yield started
    for proc in started:
        proc.stop()


def test_a_restarted_simulator_numbers_from_0_and_starts_with_all_blocks_cleared(
    processes: list[RunningProcess], tmp_path: Path
) -> None:
    port, replay_port, http_port = free_port(), free_port(), free_port()
    replay_endpoint = f"tcp://127.0.0.1:{replay_port}"
    config = sglang_config(port, replay_endpoint=replay_endpoint)
    args = ["sim-replica", "--port", str(http_port), "--preset", "tiny-test", "--time-scale", "0.02"]

    def start() -> RunningProcess:
        proc = start_spillgate(
            [*args, "--kv-events-config", config], port=http_port, log_dir=tmp_path, ready_path="/ready"
        )
        processes.append(proc)
        return proc

    first = start()
    sub = Subscriber(f"tcp://127.0.0.1:{port}")  # stays connected across the restart
    try:
        sync_by_flush(first, sub)
        for seed in range(3):
            _send(first, "sglang", distinct_ids(100, seed), None, 2)
        before = cache_content(first)["kv_events_next_seq"]
        assert before > 3
        sub.until(lambda: sub.batches[-1][1] == before - 1)
        first.stop()
        second = start()
        answer = replay(replay_endpoint, 0)
        assert [int.from_bytes(f[2], "big") for f in answer[:-1]] == [0]
        assert msgspec.msgpack.decode(answer[0][3])[1] == [{"type": "AllBlocksCleared"}]
        heard = len(sub.frames)
        sync_by_flush(second, sub)  # the SUB reconnects by itself; its first batches are flushes
        _send(second, "sglang", distinct_ids(100, 9), None, 2)
        last = cache_content(second)["kv_events_next_seq"] - 1
        sub.until(lambda: sub.batches[-1][1] == last)
        seqs = [seq for _, seq, _ in sub.batches[heard:]]
        assert 1 <= seqs[0] < before - 1, "the live numbering started again (0 went out before anyone listened)"
        assert seqs == list(range(seqs[0], last + 1))
    finally:
        sub.close()


def test_vllms_dev_mode_reset_prefix_cache_publishes_all_blocks_cleared(
    start_sim: StartReplica, processes: list[RunningProcess], tmp_path: Path
) -> None:
    """vLLM serves ``/reset_prefix_cache`` only with ``VLLM_SERVER_DEV_MODE=1``; it empties the cache and says so."""
    plain = start_sim("sim-replica", "--bare", "--engine", "vllm")
    assert httpx.post(plain.url + "/reset_prefix_cache", timeout=10).status_code == 404
    port, http_port = free_port(), free_port()
    sub = Subscriber(f"tcp://127.0.0.1:{port}", bind=True)
    args = ["sim-replica", "--port", str(http_port), "--engine", "vllm", "--time-scale", "0.02"]
    dev = start_spillgate(
        [*args, "--kv-events-config", vllm_config(port)],
        port=http_port,
        log_dir=tmp_path,
        env={"VLLM_SERVER_DEV_MODE": "1"},
    )
    processes.append(dev)
    try:
        sub.drain(0.5)
        _send(dev, "vllm", distinct_ids(100, 3), None, 2)
        assert httpx.post(dev.url + "/reset_prefix_cache", timeout=10).status_code == 200
        sub.until(lambda: len(sub.batches) >= 2)
        assert [seq for _, seq, _ in sub.batches] == [0, 1]
        assert sub.batches[1][2][1] == [{"type": "AllBlocksCleared"}]
        assert cache_content(dev)["namespaces"] == []
    finally:
        sub.close()
