"""A KV-event subscription over real ZMQ sockets: batches in order, a gap filled from the replay socket (or the
record rebuilt without one), a restart clearing the record."""

from __future__ import annotations

import asyncio
import contextlib
import time
from array import array
from collections.abc import AsyncIterator

import msgspec
import pytest
import zmq
import zmq.asyncio

from spillgate.backends.kv_subscriber import KvEventSink, KvEventSource, KvSubscriber
from spillgate.backends.sim.prompt_encoder import SimulatedPromptIds
from spillgate.cache.fingerprint import cache_seed, token_block_hashes
from spillgate.cache.kv_events import EventBatch
from spillgate.gateway.dispatch.prefix import Fingerprint, PrefixTracker
from tests.support.procs import free_port


class Sink:
    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.resets: list[bool] = []
        self.behind = True
        self.applied_behind: list[int] = []
        """The batches applied while the subscription said its record was behind."""
        self.caught_up_after: list[int] = []
        """How many batches had been applied each time the subscription said it caught up."""

    def apply(self, replica: str, batch: EventBatch) -> None:
        self.seqs.append(batch.seq)
        if self.behind:
            self.applied_behind.append(batch.seq)

    def reset(self, replica: str, *, complete: bool) -> None:
        self.resets.append(complete)

    def catching_up(self, replica: str, behind: bool) -> None:
        self.behind = behind
        if not behind:
            self.caught_up_after.append(len(self.seqs))


class Publisher:
    """What an engine runs: a PUB socket and a ROUTER that replays kept batches from a given number on."""

    def __init__(self, context: zmq.asyncio.Context, *, replay: bool, cuts_replays: bool = True) -> None:
        self.port, self.replay_port = free_port(), free_port()
        self.pub = context.socket(zmq.PUB)
        self.pub.bind(f"tcp://127.0.0.1:{self.port}")
        self.router = context.socket(zmq.ROUTER) if replay else None
        if self.router is not None:
            if not cuts_replays:  # an engine's ROUTER drops past its mark; a slow reader would get a replay in rounds
                self.router.setsockopt(zmq.SNDHWM, 0)
            self.router.bind(f"tcp://127.0.0.1:{self.replay_port}")
        self.kept: dict[int, bytes] = {}
        self.task = asyncio.create_task(self._serve_replays()) if replay else None

    def source(self) -> KvEventSource:
        replay = f"tcp://127.0.0.1:{self.replay_port}" if self.router is not None else None
        return KvEventSource(f"tcp://127.0.0.1:{self.port}", replay, "kv")

    async def send(self, seq: int, *, dropped: bool = False) -> None:
        payload = msgspec.msgpack.encode([time.time(), [], 0])
        self.kept[seq] = payload
        if not dropped:
            await self.pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])

    async def _serve_replays(self) -> None:
        assert self.router is not None
        while True:
            identity, _, start = await self.router.recv_multipart()
            for seq in sorted(self.kept):
                if seq >= int.from_bytes(start, "big"):
                    await self.router.send_multipart([identity, b"", b"kv", seq.to_bytes(8, "big"), self.kept[seq]])
            await self.router.send_multipart([identity, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.pub.close(linger=0)
        if self.router is not None:
            self.router.close(linger=0)


async def wait_for(condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def connected(publisher: Publisher, sink: Sink, first: int) -> None:
    """Send batch ``first`` until the new subscription hears it (a SUB misses what is sent before it joins)."""
    while not sink.seqs:
        await publisher.send(first)
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def following(
    *,
    replay: bool,
    sink: KvEventSink | None = None,
    kept: dict[int, bytes] | None = None,
    cuts_replays: bool = True,
) -> AsyncIterator[tuple[Publisher, Sink, KvSubscriber]]:
    """An engine's publisher (having published ``kept`` before) and a subscription to it, stopped afterwards."""
    context = zmq.asyncio.Context()
    publisher = Publisher(context, replay=replay, cuts_replays=cuts_replays)
    publisher.kept.update(kept or {})
    sink = sink or Sink()
    subscriber = KvSubscriber("r", publisher.source(), sink, context)
    subscriber.start()
    try:
        yield publisher, sink, subscriber
    finally:
        await subscriber.stop()
        publisher.close()
        context.term()


@pytest.mark.parametrize("replay", [True, False])
async def test_a_gap_is_replayed_or_the_record_rebuilt(replay: bool) -> None:
    async with following(replay=replay) as (publisher, sink, subscriber):
        await connected(publisher, sink, 0)
        heard = len(sink.seqs)
        await publisher.send(1, dropped=True)
        await publisher.send(2, dropped=True)
        await publisher.send(3)
        await wait_for(lambda: sink.seqs[-1:] == [3])
        assert subscriber.gaps == 1
        if replay:
            assert sink.seqs[heard:] == [1, 2, 3] and subscriber.complete and sink.resets == [True]
        else:
            assert sink.seqs[heard:] == [3] and not subscriber.complete and sink.resets == [True, False]


async def test_numbers_starting_again_mean_a_restarted_engine() -> None:
    async with following(replay=False) as (publisher, sink, subscriber):
        await connected(publisher, sink, 0)
        await publisher.send(1)
        await wait_for(lambda: sink.seqs[-1:] == [1])
        await publisher.send(0)
        await wait_for(lambda: len(sink.resets) == 2)
        assert sink.resets == [True, True] and subscriber.complete


async def test_joining_late_without_replay_leaves_the_record_incomplete() -> None:
    async with following(replay=False) as (publisher, sink, subscriber):
        await connected(publisher, sink, 7)
        assert not subscriber.complete and sink.resets[:1] == [False]
        assert subscriber.status()["last_seq"] == 7


async def test_a_long_replay_cut_short_by_the_engines_router_is_asked_again() -> None:
    """An engine's ROUTER drops what waits past its high-water mark, so a replay of thousands of large batches
    arrives with its tail missing: the subscriber asks again from the first missing one until it has them all."""
    padding = list(range(1_000))  # ~3 KB a batch, as a busy replica's batches are
    async with following(replay=True) as (publisher, sink, subscriber):
        for seq in range(6_000):
            event = {"type": "BlockRemoved", "block_hashes": padding}
            publisher.kept[seq] = msgspec.msgpack.encode([time.time(), [event], 0])
        await connected(publisher, sink, 6_000)
        await wait_for(lambda: subscriber.last_seq == 6_000, timeout=30)
        assert sink.seqs == list(range(6_001)) and subscriber.complete


async def test_a_replayed_history_leaves_the_record_behind_until_it_is_caught_up() -> None:
    """A replica that has served a while keeps thousands of batches: while they are replayed (and then the live
    ones sent meanwhile) the record shows the past; the sink hears it is caught up once nothing waits."""
    event = {"type": "BlockRemoved", "block_hashes": list(range(1_000))}
    kept = {seq: msgspec.msgpack.encode([time.time(), [event], 0]) for seq in range(3_000)}
    async with following(replay=True, kept=kept) as (publisher, sink, subscriber):
        await wait_for(lambda: subscriber.caught_up, timeout=30)
        assert sink.seqs == list(range(3_000)) and subscriber.complete and subscriber.status()["caught_up"]
        assert sink.applied_behind == list(range(3_000)) and sink.caught_up_after == [3_000]
        seq = 3_000
        while subscriber.last_seq == 2_999:  # live batches, until the subscription hears one
            await publisher.send(seq)
            seq += 1
            await asyncio.sleep(0.05)
        await wait_for(lambda: subscriber.last_seq == seq - 1)
        assert sink.seqs == list(range(seq)) and sink.applied_behind == list(range(3_000))


async def test_an_engine_with_nothing_to_replay_is_caught_up_at_once() -> None:
    async with following(replay=True) as (_publisher, sink, subscriber):
        await wait_for(lambda: subscriber.caught_up)
        assert sink.caught_up_after == [0] and not sink.behind


BLOCK = 64


def stored(engine_hash: int, tokens: range) -> dict[str, object]:
    return {"type": "BlockStored", "block_hashes": [engine_hash], "parent_block_hash": None,
            "token_ids": list(tokens), "block_size": len(tokens)}  # fmt: skip


def fingerprint(tokens: range) -> Fingerprint:
    hashes = token_block_hashes(array("I", tokens), cache_seed(None), block_tokens=BLOCK, max_blocks=512)
    return Fingerprint(tuple(hashes), hashes[0], len(tokens))


class Watched(PrefixTracker):
    """The gateway's tracker, asked after every batch it applies what it would predict for two prompts."""

    def __init__(self, prompts: dict[str, range]) -> None:
        super().__init__(block_chars=256, max_blocks=512, tokenizer=SimulatedPromptIds(), block_tokens=BLOCK)
        self.prompts = {name: fingerprint(tokens) for name, tokens in prompts.items()}
        self.seen: list[tuple[int, dict[str, int], str]] = []
        self.capacity_known("r", 100_000)
        self.follow("r")

    def apply(self, replica: str, batch: EventBatch) -> None:
        super().apply(replica, batch)
        self.seen.append((batch.seq, self.predicted(), self.source(replica)))

    def predicted(self) -> dict[str, int]:
        return {name: self.matched_blocks(fingerprint, ["r"])["r"] for name, fingerprint in self.prompts.items()}


async def test_while_a_replay_runs_the_tracker_never_routes_on_what_the_replica_held_in_the_past() -> None:
    """An engine that cached prompt ``old`` long ago, served thousands of batches since and then dropped it all,
    and now holds ``new``. A gateway subscribing replays that history: a prediction made meanwhile from the record
    would find ``old`` held; the belief stands in until the record has caught up, then it is ``new``."""
    history = [[stored(1, range(1_000, 1_128))]]
    history += [[{"type": "BlockRemoved", "block_hashes": list(range(10, 1_010))}] for _ in range(2_000)]
    history += [[{"type": "AllBlocksCleared"}], [stored(2, range(5_000, 5_128))]]
    kept = {seq: msgspec.msgpack.encode([time.time(), events, 0]) for seq, events in enumerate(history)}
    tracker = Watched({"old": range(1_000, 1_128), "new": range(5_000, 5_128)})
    async with following(replay=True, sink=tracker, kept=kept) as (_publisher, _sink, subscriber):
        await wait_for(lambda: subscriber.last_seq == len(history) - 1, timeout=30)
        assert tracker.seen[0][0] == 0
        assert all(predicted == {"old": 0, "new": 0} for _, predicted, _ in tracker.seen), "routed on the past"
        assert {source for _, _, source in tracker.seen} == {"belief"}
        await wait_for(lambda: subscriber.caught_up)
        assert tracker.predicted() == {"old": 0, "new": 2} and tracker.source("r") == "events"


async def test_a_replay_skips_what_the_engine_cleared_since() -> None:
    """Batches before the last one that clears the cache cannot change the record: they are not applied, but the
    engine's first batch is (it shows the record complete), and the numbers carry on from the last one. (A replay
    cut short arrives in rounds, each skipping what it can on its own: here the engine sends it whole.)"""
    history = [[{"type": "BlockRemoved", "block_hashes": [seq]}] for seq in range(3_000)]
    history[1_000] = [{"type": "AllBlocksCleared"}]
    history[2_000] = [{"type": "BlockRemoved", "block_hashes": [1]}, {"type": "AllBlocksCleared"}]
    kept = {seq: msgspec.msgpack.encode([time.time(), events, 0]) for seq, events in enumerate(history)}
    async with following(replay=True, kept=kept, cuts_replays=False) as (publisher, sink, subscriber):
        await wait_for(lambda: subscriber.caught_up, timeout=30)
        assert sink.seqs == [0, *range(2_000, 3_000)]
        assert subscriber.complete and subscriber.last_seq == 2_999 and sink.resets == [True]
        await publisher.send(3_000)
        await wait_for(lambda: subscriber.last_seq == 3_000)
        assert sink.seqs[-1] == 3_000 and subscriber.gaps == 0
