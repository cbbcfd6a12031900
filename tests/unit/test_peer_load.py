"""Gateway processes tell each other their load at each replica through a real Redis, and snapshots add it."""

from __future__ import annotations

import asyncio
import os
import time

import redis.asyncio as aioredis

from spillgate.backends.backend import Backend
from spillgate.gateway.dispatch.peer_load import PeerLoad


def replicas() -> list[Backend]:
    return [Backend(name, "replica", f"http://127.0.0.1/{name}", "m") for name in ("r0", "r1")]


def key() -> str:
    return f"test-peer-load-{os.getpid()}-{time.time_ns()}"


async def test_each_process_sees_the_others_load_added_to_its_own(redis_url: str) -> None:
    shared = key()
    mine, theirs = replicas(), replicas()
    me = PeerLoad(mine, aioredis.from_url(redis_url), key=shared)
    other = PeerLoad(theirs, aioredis.from_url(redis_url), key=shared)
    try:
        theirs[0].own.in_flight, theirs[0].own.pending_prefill_tokens, theirs[0].own.outstanding_tokens = 3, 1200, 64
        mine[0].own.in_flight, mine[0].own.pending_prefill_tokens = 1, 500
        await other.exchange_once()
        await me.exchange_once()
        assert me.peers == 1
        assert (mine[0].peers.in_flight, mine[0].peers.pending_prefill_tokens, mine[0].peers.outstanding_tokens) == (
            3,
            1200,
            64,
        )
        assert (mine[1].peers.in_flight, mine[1].peers.pending_prefill_tokens) == (0, 0)
        state = mine[0].state(time.monotonic())
        assert (state.in_flight, state.pending_prefill_tokens, state.outstanding_tokens) == (4, 1700, 64)
        assert mine[0].own.in_flight == 1, "a process's own count stays its own"

        # The other's prefilled tokens arrive as a running total: each read adds what is new.
        theirs[0].own.prefilled_tokens = 900
        await other.exchange_once()
        await me.exchange_once()
        theirs[0].own.prefilled_tokens = 1000
        await other.exchange_once()
        await me.exchange_once()
        await me.exchange_once()  # nothing new: nothing added
        assert mine[0].peers.prefilled_tokens == 1000

        # The other stops: its field goes at once, and with it its load.
        await other.stop()
        await me.exchange_once()
        assert me.peers == 0 and mine[0].peers.in_flight == 0 and mine[0].peers.pending_prefill_tokens == 0
    finally:
        await me.stop()


async def test_a_process_that_stops_publishing_is_left_out_and_garbage_is_ignored(redis_url: str) -> None:
    shared = key()
    mine, theirs = replicas(), replicas()
    me = PeerLoad(mine, aioredis.from_url(redis_url), key=shared, stale_after_s=0.2)
    silent = PeerLoad(theirs, aioredis.from_url(redis_url), key=shared)
    client = aioredis.from_url(redis_url)
    try:
        await client.hset(shared, "another-version", b"not json")
        theirs[1].own.in_flight = 5
        await silent.exchange_once()
        await me.exchange_once()
        assert me.peers == 1 and mine[1].peers.in_flight == 5
        await asyncio.sleep(0.3)  # it publishes no more (killed, say): its last word goes stale
        await me.exchange_once()
        await me.exchange_once()
        assert me.peers == 0 and mine[1].peers.in_flight == 0
    finally:
        await me.stop()
        await client.delete(shared)
        await client.aclose()
        await silent._redis.aclose()
