"""One KV-event subscription per replica that publishes, kept in step with the config and with the replicas.

Where a replica publishes comes from its pool's ``kv_events.endpoint`` or, by default, from the replica itself
(read when it registers: SGLang's ``/server_info``, vLLM's ``/kv_event_sources``). A replica that starts
publishing, moves, restarts with another address or leaves the config is picked up at the next look, once a
second. Every gateway process follows every replica itself: the engines' PUB sockets fan out, so no process
depends on another for what replicas hold.

A data-parallel replica publishes one stream per rank, rank r on the port + r (its replay socket likewise); how
many ranks it has comes from the replica (SGLang's ``dp_size``, the ranks vLLM lists), also where the config gives
the endpoint. Each rank gets its own subscription, record and counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from urllib.parse import urlsplit

import zmq.asyncio

from spillgate.backends.backend import Backend
from spillgate.backends.engines import KvEventSource
from spillgate.backends.engines.base import with_ranks
from spillgate.backends.kv_subscriber import KvSubscriber
from spillgate.gateway.dispatch.prefix import PrefixTracker, rank_record

log = logging.getLogger("spillgate.kv_events")

_LOOK_EVERY_S = 1.0


def event_source(backend: Backend) -> KvEventSource | None:
    """Where ``backend``'s events are to be read (rank 0's, and how many ranks publish), or None: not a replica,
    switched off, or not publishing."""
    if backend.kind != "replica" or not backend.kv_events_enabled:
        return None
    learned = backend.info.kv_events if backend.info is not None else None
    if backend.kv_events is not None:
        return with_ranks(backend.kv_events, learned)
    if learned is None:
        return None
    host = urlsplit(backend.base_url).hostname or "127.0.0.1"
    return with_ranks(learned.at_host(f"[{host}]" if ":" in host else host), None)


class KvEventFeeds:
    """Starts, moves and stops the subscriptions; their state is shown in ``/health``."""

    def __init__(self, prefix: PrefixTracker) -> None:
        self._prefix = prefix
        self._context: zmq.asyncio.Context | None = None
        self._subscribers: dict[str, list[KvSubscriber]] = {}
        """Per replica, one subscription per data-parallel rank, in rank order."""
        self._sources: dict[str, KvEventSource] = {}
        self._backends: dict[str, Backend] = {}
        self._task: asyncio.Task[None] | None = None
        self._backends_source: Iterable[Backend] = ()

    @property
    def usable(self) -> bool:
        """Events can be matched only against the engine's own token ids (``prefix.tokenizer``)."""
        return self._prefix.exact is not None

    async def start(self, backends: Iterable[Backend]) -> None:
        self._backends_source = backends
        self._context = zmq.asyncio.Context()
        self._task = asyncio.create_task(self._look_forever(), name="spillgate-kv-feeds")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for name in list(self._subscribers):
            await self._drop(name)
        if self._context is not None:
            self._context.term()

    def status(self, backend: Backend) -> dict[str, object]:
        """For ``/health``: where the replica's prefix predictions come from, and its subscription (rank 0's; a
        data-parallel replica's every rank's under ``dp_ranks``, with this process's requests in flight there)."""
        subscribers = self._subscribers.get(backend.name)
        source = event_source(backend)
        shown: dict[str, object] = {
            "source": self._prefix.source(backend.name),
            "predictions": self._prefix.prediction_counts(backend.name),
        }
        if subscribers:
            shown["events"] = subscribers[0].status()
            if len(subscribers) > 1:
                outstanding = self._prefix.outstanding(backend.name)
                shown["dp_ranks"] = [
                    {**subscriber.status(), "in_flight": outstanding[rank] if rank < len(outstanding) else 0}
                    for rank, subscriber in enumerate(subscribers)
                ]
        elif source is not None and not self.usable:
            shown["events"] = {
                "endpoint": source.endpoint,
                "unused": "prefix.tokenizer must give the engine's token ids (the model's directory, or 'simulated')",
            }
        return shown

    def lag_s(self, replica: str) -> float | None:
        """The replica's lag: its most lagging rank's."""
        lags = [s.lag_s for s in self._subscribers.get(replica, ()) if s.lag_s is not None]
        return max(lags) if lags else None

    async def look(self) -> None:
        """Bring the subscriptions in line with the replicas now configured and what they report."""
        wanted: dict[str, tuple[Backend, KvEventSource]] = {}
        if self.usable:
            for backend in self._backends_source:
                source = event_source(backend)
                if source is not None:
                    wanted[backend.name] = (backend, source)
        for name in list(self._subscribers):
            current = wanted.get(name)
            if current is None or current[1] != self._sources[name] or current[0] is not self._backends[name]:
                await self._drop(name)
        for name, (backend, source) in wanted.items():
            if name not in self._subscribers:
                self._follow(backend, source)

    def _follow(self, backend: Backend, source: KvEventSource) -> None:
        assert self._context is not None
        name, ranks = backend.name, source.ranks or 1
        self._prefix.follow(name, ranks)
        context, sink = self._context, self._prefix
        subscribers = [
            KvSubscriber(rank_record(name, rank), source.rank(rank), sink, context, rank=rank if ranks > 1 else None)
            for rank in range(ranks)
        ]
        for subscriber in subscribers:
            subscriber.start()
        self._subscribers[name] = subscribers
        self._sources[name] = source
        self._backends[name] = backend
        shown = source.endpoint if ranks == 1 else f"{source.endpoint} and the {ranks - 1} ports after (one per rank)"
        log.info("following KV events of %s at %s", name, shown)

    async def _drop(self, name: str) -> None:
        subscribers = self._subscribers.pop(name)
        self._sources.pop(name, None)
        self._backends.pop(name, None)
        for subscriber in subscribers:
            await subscriber.stop()
        self._prefix.unfollow(name)

    async def _look_forever(self) -> None:
        while True:
            try:
                await self.look()
            except Exception:  # one bad look must not end the feeds for good
                log.exception("KV event subscriptions: look failed")
            await asyncio.sleep(_LOOK_EVERY_S)
