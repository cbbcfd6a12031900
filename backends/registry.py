"""Every backend by name (:class:`~backends.backend.Backend`), and the poller that keeps their health fresh.

Replicas are probed off the request path, each through its engine (:mod:`backends.engines`): a liveness check
every interval, its ``/metrics`` scraped alongside, its limits read when it registers and after a restart, and
now and then a check that runs a generation. The load the gateway's own requests put on each backend is not
the registry's: dispatch tickets write it (:mod:`gateway.dispatch.ticket`).
Policies never see this mutable state: they get an immutable :class:`~policies.types.Snapshot`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

import httpx

from spillgate.backends.backend import Backend
from spillgate.backends.engines import ReplicaInfo, ReplicaLoad
from spillgate.backends.engines.base import Get
from spillgate.backends.outlier import OutlierRules
from spillgate.policies.types import Snapshot

log = logging.getLogger("spillgate.backends")

DEPARTED_KEPT_S = 60.0
"""How long a replica that left the catalog stays reachable by name after its last request: a request admitted
just before it left may still look it up (to book it, or to fall back from it)."""


def external_load(load: ReplicaLoad, ours: int) -> int:
    """Other clients' requests in a scrape: what the replica counted beyond ``ours``, the most of this gateway's
    that can have been there while it answered (in flight when the probe left, plus those sent since). One of
    ours that finished meanwhile is no phantom load for a whole probe interval; another client's request hides
    only for as long as ours are over-counted."""
    return max(0, load.running + load.queued - ours)


class ReplicaEvents(Protocol):
    """Told what probes learn, so caches of replica state (the prefix index) stay true."""

    def capacity_known(self, replica: str, max_total_tokens: int) -> None: ...

    def restarted(self, replica: str) -> None: ...

    def removed(self, replica: str) -> None:
        """The replica is gone for good: forget what it held."""
        ...


class BackendRegistry:
    """Every backend by name, plus the background task that probes the replicas."""

    def __init__(
        self,
        backends: Iterable[Backend],
        *,
        interval_s: float,
        timeout_s: float,
        unhealthy_after: int,
        generation_check_s: float = 0.0,
        events: ReplicaEvents | None = None,
        outlier: OutlierRules | None = None,
    ) -> None:
        """``generation_check_s``: how often to run the engines' generation checks (0: never)."""
        self._backends = {b.name: b for b in backends}
        self._departed: dict[str, tuple[Backend, float]] = {}
        """Replicas that left the catalog and are draining: by name, with when they were last seen busy."""
        self.outlier = outlier or OutlierRules()
        """Thresholds of passive outlier detection; a config change may replace them."""
        self._events = events
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._unhealthy_after = unhealthy_after
        self._generation_every = max(1, round(generation_check_s / interval_s)) if generation_check_s > 0 else 0
        self._checking: set[str] = set()
        self._check_tasks: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._http: httpx.AsyncClient | None = None

    def __getitem__(self, name: str) -> Backend:
        backend = self._backends.get(name)
        if backend is None:
            departed = self._departed.get(name)
            if departed is None:
                raise KeyError(name)
            return departed[0]
        return backend

    def replace(self, backends: Iterable[Backend]) -> None:
        """Serve a new set of backends (a new config version, or discovery); the next poll probes the new ones.

        A replica that leaves is drained: no new request picks it (its state is unhealthy), those in flight finish
        on it, and it stays reachable by name until :meth:`sweep` finds it idle long enough."""
        new = {b.name: b for b in backends}
        kept = {id(b) for b in new.values()}
        now = time.monotonic()
        for backend in self._backends.values():
            if id(backend) not in kept and backend.kind == "replica":
                backend.departed = True
                busy = backend.own.in_flight
                if busy:
                    log.warning("replica %s left rotation: draining %d request(s) in flight", backend.name, busy)
                else:
                    log.warning("replica %s left rotation", backend.name)
                self._departed[backend.name] = (backend, now)
        for backend in new.values():
            backend.departed = False
            departed = self._departed.get(backend.name)
            if departed is not None and departed[0] is backend:
                del self._departed[backend.name]  # back before it was swept (a pod ready again)
        self._backends = new

    def known(self) -> dict[str, Backend]:
        """Every backend by name, draining ones included (under a name now taken, the serving one): what a new
        catalog may reuse, so a replica back at its address keeps what was learned about it."""
        return {name: backend for name, (backend, _) in self._departed.items()} | self._backends

    def draining(self) -> list[Backend]:
        """Replicas that left the catalog and still finish requests here."""
        return [backend for backend, _ in self._departed.values() if backend.own.in_flight]

    def sweep(self, now: float | None = None) -> list[str]:
        """Forget replicas that left and have had nothing in flight for :data:`DEPARTED_KEPT_S`; the names whose
        state is now gone for good (no serving backend has the name) are told to ``events.removed``."""
        now = time.monotonic() if now is None else now
        gone = []
        for name, (backend, since) in list(self._departed.items()):
            if backend.own.in_flight:
                self._departed[name] = (backend, now)
                continue
            if now - since < DEPARTED_KEPT_S:
                continue
            del self._departed[name]
            if name not in self._backends:
                gone.append(name)
                log.info("replica %s drained and removed", name)
                if self._events is not None:
                    self._events.removed(name)
        return gone

    def __iter__(self) -> Iterator[Backend]:
        return iter(self._backends.values())

    def snapshot(self, names: Iterable[str], prefix_tokens: Mapping[str, int] | None = None) -> Snapshot:
        now = time.monotonic()
        backends = self._backends
        hits = (prefix_tokens or {}).get
        try:
            return Snapshot(tuple([backends[n].state(now, hits(n, 0)) for n in names]))
        except KeyError:  # a route read just before a replica left: the departed one shows unhealthy
            return Snapshot(tuple([self[n].state(now, hits(n, 0)) for n in names]))

    def any_healthy(self) -> bool:
        now = time.monotonic()
        return any(b.state(now).healthy for b in self._backends.values())

    def request_failed(self, backend: Backend, reason: str, *, unreachable: bool = False) -> bool:
        """A request to ``backend`` failed (``unreachable``: it could not even connect). Returns whether this
        ejected the replica (:mod:`backends.outlier`), for the caller to count and log."""
        backend.last_error = reason
        if unreachable:
            # Until a probe says otherwise: the process may be gone, there is no point waiting for a breaker.
            now = time.monotonic()
            if backend.healthy and now >= backend.unhealthy_until:  # a change of state: said once
                log.warning("%s %s is unreachable: out of rotation (%s)", backend.kind, backend.name, reason)
            backend.unhealthy_until = now + self._interval_s * self._unhealthy_after
            if backend.kind == "replica":
                backend.healthy = False
        if backend.kind != "replica":
            return False
        now = time.monotonic()
        rules = self.outlier
        pool = [b for b in self._backends.values() if b.kind == "replica" and b.pool == backend.pool]
        out = sum(1 for b in pool if b is not backend and b.breaker.shown(now) != "closed")
        ejected = backend.breaker.failed(rules, now, reason, may_eject=rules.may_eject(len(pool), out))
        if ejected:
            log.warning(
                "replica %s ejected for %gs after %d failed request(s) in a row (ejection %d in a row): %s",
                backend.name,
                backend.breaker.ejected_until - now,
                backend.breaker.consecutive,
                backend.breaker.ejections,
                reason,
            )
        return ejected

    def request_succeeded(self, backend: Backend) -> None:
        """``backend`` answered a request properly: its failures in a row end, a half-open trial passes."""
        if backend.kind == "replica":
            if backend.breaker.state == "half_open":
                log.warning("replica %s passed its trial request: back in rotation", backend.name)
            backend.breaker.succeeded()

    def dispatched(self, backend: Backend) -> bool:
        """A request is being sent to ``backend``; returns whether it is a half-open trial, which must end in
        :meth:`request_failed`, :meth:`request_succeeded` or :meth:`trial_abandoned`."""
        return backend.kind == "replica" and backend.breaker.dispatched(time.monotonic())

    def trial_abandoned(self, backend: Backend) -> None:
        """A trial request ended without telling anything (the client left): the next request tries instead."""
        backend.breaker.abandoned()

    async def start(self) -> None:
        """Probe once before serving, so ``/ready`` and the first decisions see real state."""
        self._http = httpx.AsyncClient(timeout=self._timeout_s)
        await self.poll_once()
        self._task = asyncio.create_task(self._poll_forever(), name="spillgate-backend-poller")

    async def stop(self) -> None:
        for task in [self._task, *self._check_tasks]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._http is not None:
            await self._http.aclose()

    async def poll_once(self) -> None:
        replicas = [b for b in self._backends.values() if b.kind == "replica"]
        await asyncio.gather(*(self._probe(b) for b in replicas))

    async def _poll_forever(self) -> None:
        polls = 0
        while True:
            await asyncio.sleep(self._interval_s)
            polls += 1
            self.sweep()
            if self._generation_every and polls % self._generation_every == 0:
                self._start_generation_checks()
            await self.poll_once()

    def _get(self, backend: Backend, timeout: float | None = None) -> Get:
        assert self._http is not None
        http, headers = self._http, dict(backend.request_headers)  # its key, if it has one
        extra = {"timeout": timeout} if timeout is not None else {}

        async def get(path: str) -> httpx.Response:
            return await http.get(backend.base_url + path, headers=headers, **extra)

        return get

    async def _probe(self, backend: Backend) -> None:
        get = self._get(backend)
        engine = backend.engine
        in_flight, sent = backend.own.in_flight, backend.own.sent_total  # ours when the probe left
        try:
            alive = await get(engine.liveness_path)
            if alive.status_code == 404 and engine.liveness_path != "/health":
                alive = await get("/health")  # an older server without the engine's quick check
            alive.raise_for_status()
            # A replica that only answered slowly or with an error status kept its cache. One that refused
            # connections, or whose counters started again (even between two probes), is a new process: it
            # comes back with an empty cache and perhaps new limits.
            restarted = backend.lost_connection
            if engine.metrics_path is not None and (backend.info is None or backend.info.metrics):
                metrics = await get(engine.metrics_path)
                if metrics.status_code == 200:
                    load = engine.parse_load(metrics.text)
                    restarted |= load.prompt_tokens_total < backend.load.prompt_tokens_total
                    backend.load = load
                    ours = in_flight + backend.own.sent_total - sent + backend.peers.in_flight
                    backend.external_load = external_load(load, ours)
            if restarted:
                log.info("replica %s restarted: forgetting what it had cached", backend.name)
                backend.info = None  # read again: a new process may have other limits
                backend.max_total_tokens = 0
                backend.generation_failed = False
                if self._events is not None:
                    self._events.restarted(backend.name)
            if backend.info is None:
                await self._describe(backend, get)
        except (httpx.HTTPError, ValueError) as exc:
            backend.consecutive_failures += 1
            backend.last_error = f"probe failed: {type(exc).__name__}"
            backend.lost_connection |= isinstance(exc, httpx.ConnectError)
            if backend.consecutive_failures >= self._unhealthy_after and backend.healthy:
                log.warning("replica %s is unhealthy: %s", backend.name, backend.last_error)
                backend.healthy = False
            return
        if backend.generation_failed:
            return  # alive, but it generated nothing in its last check: out until a check passes
        if not backend.healthy:
            log.warning("replica %s is healthy again: back in rotation", backend.name)
        backend.lost_connection = False
        backend.consecutive_failures = 0
        backend.healthy = True
        backend.unhealthy_until = 0.0
        backend.last_error = ""

    async def _describe(self, backend: Backend, get: Get) -> None:
        """Limits and switched-on features from the replica itself; a server that does not say keeps the
        configured figures (and an index sized by assumption)."""
        try:
            info = await backend.engine.describe(get, backend.served_model)
        except (httpx.HTTPStatusError, ValueError, KeyError, TypeError) as exc:
            log.warning("replica %s did not describe itself (%s): using configured limits", backend.name, exc)
            info = ReplicaInfo(metrics=backend.engine.metrics_path is not None)  # scraped while it answers
        backend.info = info
        backend.max_total_tokens = info.max_total_tokens
        backend.max_running = info.max_running
        backend.prefill_batch_tokens = info.prefill_batch_tokens
        if info.context_window:
            backend.context_window = info.context_window
        for feature in info.missing:
            log.warning("replica %s (%s): without %s", backend.name, backend.engine.name, feature)
        if info.max_total_tokens and self._events is not None:
            self._events.capacity_known(backend.name, info.max_total_tokens)

    def _start_generation_checks(self) -> None:
        """At most one check under way per replica; each runs as long as its engine's own check may take."""
        for backend in self._backends.values():
            check = backend.engine.generation_check
            if backend.kind != "replica" or check is None or backend.name in self._checking:
                continue
            self._checking.add(backend.name)
            task = asyncio.create_task(self._check_generation(backend, *check))
            self._check_tasks.add(task)
            task.add_done_callback(self._check_tasks.discard)

    async def _check_generation(self, backend: Backend, path: str, timeout_s: float) -> None:
        try:
            response = await self._get(backend, timeout_s)(path)
            failed = response.status_code != 200 and response.status_code != 404
            reason = f"generation check failed: {response.status_code}"
        except httpx.HTTPError as exc:
            failed, reason = True, f"generation check failed: {type(exc).__name__}"
        finally:
            self._checking.discard(backend.name)
        if failed and not backend.generation_failed:
            log.warning("replica %s is unhealthy: %s", backend.name, reason)
            backend.healthy = False
            backend.last_error = reason
        backend.generation_failed = failed
