"""Live state of every backend, and the poller that keeps it fresh.

Replicas are probed on ``/health`` and scraped on ``/metrics`` and ``/get_server_info`` off the request
path; the gateway adds its own in-flight counts as requests come and go. Policies never see this mutable
state: they get an immutable :class:`~policies.types.Snapshot`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from backends.prefill_rate import PrefillRateEstimator
from backends.sglang_metrics import ReplicaLoad, parse_replica_load
from policies.types import BackendKind, BackendState, Snapshot

log = logging.getLogger("spillgate.backends")


@dataclass(slots=True)
class Backend:
    """One backend as the gateway knows it right now."""

    name: str
    kind: BackendKind
    base_url: str
    served_model: str
    api_key: str | None = None
    healthy: bool = True
    consecutive_failures: int = 0
    lost_connection: bool = False
    """A probe since the last good one could not connect at all: the process may have been restarted."""
    unhealthy_until: float = 0.0
    in_flight: int = 0
    pending_prefill_tokens: int = 0
    prefill_tokens_per_s: float = 20000.0
    """The configured prior; ``prefill.rate`` is what routing uses once measurements exist."""
    max_running: int = 0
    prefill_batch_tokens: int = 0
    """New tokens one prefill batch takes (SGLang's ``chunked_prefill_size``); 0 when unknown."""
    max_waiting_prefill: int | None = None
    """Uncached prompt tokens that may wait unscheduled there before the gateway holds new prompts back
    (None: an eighth of a prefill batch; 0: never hold)."""
    mean_service_s: float = 0.0
    tier: int = 0
    context_window: int = 0
    usd_per_mtok_in: float = 0.0
    usd_per_mtok_out: float = 0.0
    ttft_s: float = 0.0
    """Recent TTFT (prior from config until measured)."""
    tpot_s: float = 0.0
    outstanding_tokens: int = 0
    last_first_token_at: float = 0.0
    """When the latest first token of a streamed request came back from here (``perf_counter``)."""
    running_prefill_tokens: int = 0
    """Of ``pending_prefill_tokens``, those of the prefill batch in progress here (:mod:`gateway.coalesce`)..."""
    running_prefill_since: float = 0.0
    """...which started then (``time.monotonic``): what it has computed since is counted as done."""
    load: ReplicaLoad = field(default_factory=ReplicaLoad)
    external_load: int = 0
    """What the last scrape showed beyond the gateway's requests in flight, its other processes' included
    (see ``BackendState``)."""
    prefilled_tokens: int = 0
    """Uncached prompt tokens of this process's streamed requests whose first token came back: a running total
    the other gateway processes read (:mod:`gateway.peer_load`)."""
    peer_in_flight: int = 0
    """The other gateway processes' requests in flight here, as they last said (:mod:`gateway.peer_load`)..."""
    peer_pending_prefill_tokens: int = 0
    """...their uncached prompt tokens not yet past the first token..."""
    peer_outstanding_tokens: int = 0
    """...their output tokens still to come..."""
    peer_prefilled_tokens: int = 0
    """...and the uncached prompt tokens their requests here have had prefilled, a running total."""
    peer_prefilled_at_first_token: int = 0
    """``peer_prefilled_tokens`` when this process's latest first token came back from here."""
    max_total_tokens: int = 0
    last_error: str = ""
    prefill: PrefillRateEstimator = field(init=False)
    request_headers: tuple[tuple[bytes, bytes], ...] = ()
    """Sent with every proxied request: content type, and the provider key for hosted models."""

    def __post_init__(self) -> None:
        self.prefill = PrefillRateEstimator(self.prefill_tokens_per_s)
        headers = [(b"content-type", b"application/json")]
        if self.api_key:
            headers.append((b"authorization", f"Bearer {self.api_key}".encode()))
        self.request_headers = tuple(headers)

    def own_pending_prefill(self, now: float) -> int:
        """This process's uncached tokens here not yet computed: those before their first token, less what the
        batch under way has computed since it started (counted whole, a short queue behind a batch looks 1.5x
        as long)."""
        pending = self.pending_prefill_tokens
        if self.running_prefill_tokens:
            done = (now - self.running_prefill_since) * self.prefill.rate
            pending -= min(self.running_prefill_tokens, int(done))
        return pending

    def state(self, now: float, prefix_tokens: int = 0) -> BackendState:
        load = self.load
        pending = self.pending_prefill_tokens + self.peer_pending_prefill_tokens
        if self.running_prefill_tokens:  # own_pending_prefill, inlined: this runs per candidate per request
            done = (now - self.running_prefill_since) * self.prefill.rate
            pending -= min(self.running_prefill_tokens, int(done))
        # Built once per candidate per request: positional, in BackendState's field order, through tuple.__new__
        # (what the named tuple's own constructor calls after binding 22 arguments, which costs twice as much).
        return _new_state(
            BackendState,
            (
                self.name,
                self.kind,
                self.healthy and now >= self.unhealthy_until,
                self.in_flight + self.peer_in_flight,
                load.running,
                load.queued,
                load.token_usage,
                load.cache_hit_rate,
                self.max_total_tokens,
                prefix_tokens,
                pending,
                self.prefill.rate,
                self.max_running,
                self.mean_service_s,
                self.tier,
                self.context_window,
                self.ttft_s,
                self.tpot_s,
                self.usd_per_mtok_in,
                self.usd_per_mtok_out,
                self.outstanding_tokens + self.peer_outstanding_tokens,
                self.prefill.overhead_s,
                self.external_load,
            ),
        )

    def observe_service_time(self, seconds: float) -> None:
        """Fold one finished request's end-to-end time into the recent mean."""
        self.mean_service_s = _ewma(self.mean_service_s, seconds)

    def observe_latency(self, ttft_s: float | None, tpot_s: float | None) -> None:
        """Fold a streamed request's TTFT and TPOT into the recent means (what hosted decisions predict from)."""
        if ttft_s is not None:
            self.ttft_s = _ewma(self.ttft_s, ttft_s)
        if tpot_s is not None:
            self.tpot_s = _ewma(self.tpot_s, tpot_s)


_new_state = tuple.__new__


def _ewma(current: float, sample: float, weight: float = 0.1) -> float:
    return sample if not current else (1 - weight) * current + weight * sample


class ReplicaEvents(Protocol):
    """Told what probes learn, so caches of replica state (the prefix index) stay true."""

    def capacity_known(self, replica: str, max_total_tokens: int) -> None: ...

    def restarted(self, replica: str) -> None: ...


class BackendRegistry:
    """Every backend by name, plus the background task that probes the replicas."""

    def __init__(
        self,
        backends: Iterable[Backend],
        *,
        interval_s: float,
        timeout_s: float,
        unhealthy_after: int,
        events: ReplicaEvents | None = None,
    ) -> None:
        self._backends = {b.name: b for b in backends}
        self._events = events
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._unhealthy_after = unhealthy_after
        self._task: asyncio.Task[None] | None = None
        self._http: httpx.AsyncClient | None = None

    def __getitem__(self, name: str) -> Backend:
        return self._backends[name]

    def replace(self, backends: Iterable[Backend]) -> None:
        """Serve a new set of backends (a new config version); the next poll probes the new ones."""
        self._backends = {b.name: b for b in backends}

    def __iter__(self) -> Iterator[Backend]:
        return iter(self._backends.values())

    def snapshot(self, names: Iterable[str], prefix_tokens: Mapping[str, int] | None = None) -> Snapshot:
        now = time.monotonic()
        backends = self._backends
        hits = (prefix_tokens or {}).get
        return Snapshot(tuple([backends[n].state(now, hits(n, 0)) for n in names]))

    def any_healthy(self) -> bool:
        now = time.monotonic()
        return any(b.state(now).healthy for b in self._backends.values())

    def report_failure(self, backend: Backend, reason: str) -> None:
        """A request could not reach ``backend``: take it out of rotation until a probe says otherwise."""
        backend.last_error = reason
        backend.unhealthy_until = time.monotonic() + self._interval_s * self._unhealthy_after
        if backend.kind == "replica":
            backend.healthy = False

    async def start(self) -> None:
        """Probe once before serving, so ``/ready`` and the first decisions see real state."""
        self._http = httpx.AsyncClient(timeout=self._timeout_s)
        await self.poll_once()
        self._task = asyncio.create_task(self._poll_forever(), name="spillgate-backend-poller")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._http is not None:
            await self._http.aclose()

    async def poll_once(self) -> None:
        replicas = [b for b in self._backends.values() if b.kind == "replica"]
        await asyncio.gather(*(self._probe(b) for b in replicas))

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.poll_once()

    async def _probe(self, backend: Backend) -> None:
        assert self._http is not None
        try:
            health = await self._http.get(backend.base_url + "/health")
            health.raise_for_status()
            # A replica that only answered slowly or with an error status kept its cache. One that refused
            # connections, or whose counters started again (even between two probes), is a new process: it
            # comes back with an empty cache and perhaps a new capacity.
            restarted = backend.lost_connection
            metrics = await self._http.get(backend.base_url + "/metrics")
            if metrics.status_code == 200:
                load = parse_replica_load(metrics.text)
                restarted |= load.prompt_tokens_total < backend.load.prompt_tokens_total
                backend.load = load
                ours = backend.in_flight + backend.peer_in_flight
                backend.external_load = max(0, load.running + load.queued - ours)
            if restarted:
                log.info("replica %s restarted: forgetting what it had cached", backend.name)
                backend.max_total_tokens = 0  # read again: a new process may have another capacity
                if self._events is not None:
                    self._events.restarted(backend.name)
            if backend.max_total_tokens == 0:
                await self._read_server_info(backend)
        except (httpx.HTTPError, ValueError) as exc:
            backend.consecutive_failures += 1
            backend.last_error = f"probe failed: {type(exc).__name__}"
            backend.lost_connection |= isinstance(exc, httpx.ConnectError)
            if backend.consecutive_failures >= self._unhealthy_after and backend.healthy:
                log.warning("replica %s is unhealthy: %s", backend.name, backend.last_error)
                backend.healthy = False
            return
        if not backend.healthy:
            log.info("replica %s is healthy again", backend.name)
        backend.lost_connection = False
        backend.consecutive_failures = 0
        backend.healthy = True
        backend.unhealthy_until = 0.0

    async def _read_server_info(self, backend: Backend) -> None:
        """Capacity and limits from ``/get_server_info``; tolerant of a replica that does not serve it."""
        assert self._http is not None
        info = await self._http.get(backend.base_url + "/get_server_info")
        if info.status_code != 200:
            return
        server_info = info.json()
        backend.max_total_tokens = int(server_info.get("max_total_num_tokens") or 0)
        backend.max_running = int(server_info.get("max_running_requests") or 0)
        backend.prefill_batch_tokens = max(0, int(server_info.get("chunked_prefill_size") or 0))
        if backend.max_total_tokens and self._events is not None:
            self._events.capacity_known(backend.name, backend.max_total_tokens)
