"""What the other gateway processes have in flight at each replica, shared through Redis.

Behind a load balancer, several gateway processes send to the same replicas. Each counts its own requests
exactly (in flight, uncached prompt tokens not yet past the first token, output still to come) and would
predict TTFT from its share of every queue alone: the replicas' scraped counts show the others only every
probe interval, and as request counts, not queued prefill. Measured on ``compare_routers --gateways 2``, the
predictions' median stayed right but their spread doubled, and the TTFT tail grew (docs/multi-process.md has
the current figures).

So every ``interval_s`` each process writes its counts into one Redis hash, a field per process, and reads the
others' in the same round trip; their sums go onto each :class:`~backends.backend.Backend` (its ``peers``), and
every snapshot adds them to the process's own. Nothing here is on the request path: a decision reads attributes.
Each process also publishes a running total of the uncached tokens its requests have had prefilled per
replica, so that the one measuring how fast a replica drains its queue counts the work the others put in
between two of its own first tokens (:meth:`gateway.dispatch.ticket.DispatchTicket.first_token`).

A process that stops publishing (killed, cut off) is ignored once its entry has not changed for
``stale_after_s`` of this process's clock (no clocks are compared across hosts), and its field is deleted
later. While Redis is unreachable the others' counts are dropped after the same delay: each process then
routes on its own counts, as it does alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from spillgate.backends.backend import Backend
from spillgate.gateway.tasks import stop_if_cancelled

log = logging.getLogger("spillgate.peer_load")

_FORGET_AFTER_STALE = 20
"""A silent process's field is deleted once it has been stale this many times over."""


@dataclass(slots=True)
class _Peer:
    payload: bytes
    changed_at: float
    """When its payload last changed, by this process's clock: a live process changes it every exchange."""
    counts: dict[str, list[int]]
    """Per replica: in flight, pending prefill tokens, outstanding tokens, prefilled tokens (a running total)."""


class PeerLoad:
    """Publishes this process's per-replica counts and adds up the other processes' onto the backends."""

    def __init__(
        self,
        backends: Iterable[Backend],
        client: aioredis.Redis,
        *,
        key: str,
        interval_s: float = 0.05,
        stale_after_s: float | None = None,
    ) -> None:
        self._backends = backends
        self._redis = client
        self._key = key
        self._interval_s = interval_s
        self._stale_after_s = stale_after_s if stale_after_s is not None else max(1.0, 10 * interval_s)
        self._origin = f"{os.getpid()}-{os.urandom(4).hex()}".encode()
        self._sequence = 0
        self._peers: dict[bytes, _Peer] = {}
        self._last_exchange = 0.0
        self._task: asyncio.Task[None] | None = None
        self.peers = 0
        """Processes whose counts the last exchange added up."""
        self.connected = False

    async def start(self) -> None:
        self._task = asyncio.create_task(self._exchange_forever(), name="spillgate-peer-load")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(RedisError, OSError):
            await self._redis.hdel(self._key, self._origin)  # gone at once, not after the stale delay
        await self._redis.aclose()

    async def _exchange_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.exchange_once()
            except (RedisError, OSError) as exc:
                stop_if_cancelled(exc)
                if self.connected:
                    log.warning("Redis unreachable (%s): routing on this process's own load", exc)
                self.connected = False
                if time.monotonic() - self._last_exchange > self._stale_after_s:
                    self._apply({}, time.monotonic())

    async def exchange_once(self) -> None:
        """Publish this process's counts and add up everyone else's: one Redis round trip."""
        self._sequence += 1
        now = time.monotonic()
        counts = {
            b.name: (b.own.in_flight, b.own_pending_prefill(now), b.own.outstanding_tokens, b.own.prefilled_tokens)
            for b in self._replicas()
        }
        payload = orjson.dumps((self._sequence, counts))
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hset(self._key, self._origin, payload)
            pipe.hgetall(self._key)
            _, fields = await pipe.execute()
        now = time.monotonic()
        self._last_exchange = now
        self.connected = True
        dead = self._apply(fields, now)
        if dead:
            await self._redis.hdel(self._key, *dead)

    def _replicas(self) -> list[Backend]:
        return [b for b in self._backends if b.kind == "replica"]

    def _apply(self, fields: dict[bytes, bytes], now: float) -> list[bytes]:
        """Sum the fresh peers' counts onto the backends; return the fields of peers long gone."""
        peers: dict[bytes, _Peer] = {}
        prefilled: dict[str, int] = {}
        dead: list[bytes] = []
        for origin, payload in fields.items():
            if origin == self._origin:
                continue
            known = self._peers.get(origin)
            if known is not None and known.payload == payload:
                if now - known.changed_at > self._stale_after_s * _FORGET_AFTER_STALE:
                    dead.append(origin)
                peers[origin] = known
                continue
            counts = _parse(payload)
            if counts is None:
                continue  # another version's format: leave that process out
            if known is not None:
                for name, values in counts.items():
                    before = known.counts.get(name)
                    if before is not None:
                        prefilled[name] = prefilled.get(name, 0) + max(0, values[3] - before[3])
            peers[origin] = _Peer(payload, now, counts)
        self._peers = peers
        fresh = [peer for peer in peers.values() if now - peer.changed_at <= self._stale_after_s]
        self.peers = len(fresh)
        for backend in self._replicas():
            in_flight = pending = outstanding = 0
            for peer in fresh:
                values = peer.counts.get(backend.name)
                if values is not None:
                    in_flight += values[0]
                    pending += values[1]
                    outstanding += values[2]
            peers = backend.peers
            peers.in_flight = in_flight
            peers.pending_prefill_tokens = pending
            peers.outstanding_tokens = outstanding
            peers.prefilled_tokens += prefilled.get(backend.name, 0)
        return dead


def _parse(payload: bytes) -> dict[str, list[int]] | None:
    """A peer's ``(sequence, {replica: [in flight, pending, outstanding, prefilled]})``, or ``None``."""
    try:
        _, counts = orjson.loads(payload)
        parsed = {str(name): [int(value) for value in values] for name, values in counts.items()}
    except (orjson.JSONDecodeError, ValueError, TypeError, AttributeError):
        return None
    return parsed if all(len(values) == 4 for values in parsed.values()) else None
