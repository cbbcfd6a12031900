"""A KV-event subscription over real ZMQ sockets: batches in order, a gap filled from the replay socket (or the
record rebuilt without one), a restart clearing the record."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator

import msgspec
import pytest
import zmq
import zmq.asyncio

from spillgate.backends.kv_subscriber import KvEventSource, KvSubscriber
from spillgate.cache.kv_events import EventBatch


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Sink:
    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.resets: list[bool] = []

    def apply(self, replica: str, batch: EventBatch) -> None:
        self.seqs.append(batch.seq)

    def reset(self, replica: str, *, complete: bool) -> None:
        self.resets.append(complete)


class Publisher:
    """What an engine runs: a PUB socket and a ROUTER that replays kept batches from a given number on."""

    def __init__(self, context: zmq.asyncio.Context, *, replay: bool) -> None:
        self.port, self.replay_port = free_port(), free_port()
        self.pub = context.socket(zmq.PUB)
        self.pub.bind(f"tcp://127.0.0.1:{self.port}")
        self.router = context.socket(zmq.ROUTER) if replay else None
        if self.router is not None:
            self.router.bind(f"tcp://127.0.0.1:{self.replay_port}")
        self.kept: dict[int, bytes] = {}
        self.task = asyncio.create_task(self._serve_replays()) if replay else None

    def source(self) -> KvEventSource:
        replay = f"tcp://127.0.0.1:{self.replay_port}" if self.router is not None else None
        return KvEventSource(f"tcp://127.0.0.1:{self.port}", replay, "kv")

    async def send(self, seq: int, *, dropped: bool = False) -> None:
        payload = msgspec.msgpack.encode([time.time(), [{"type": "AllBlocksCleared"}], 0])
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
async def following(*, replay: bool) -> AsyncIterator[tuple[Publisher, Sink, KvSubscriber]]:
    """An engine's publisher and a subscription to it, stopped afterwards."""
    context = zmq.asyncio.Context()
    publisher = Publisher(context, replay=replay)
    sink = Sink()
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
