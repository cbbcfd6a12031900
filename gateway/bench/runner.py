"""Drive one level of load: open loop (arrival times) or closed loop (N workers), bounded in time.

Every request is its own task, so in open loop a slow answer never delays the next arrival; closed-loop
workers wait for their own request only. Issuing stops at the request limit, the duration, the end of the
workload or the stop event; in-flight requests then get up to ``drain_s`` to finish. A stop (Ctrl-C) cancels
whatever is still running: those requests are counted as unfinished, and the rest still make a report.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from spillgate.gateway.bench.client import ChatClient, RequestResult
from spillgate.gateway.bench.workloads import RequestSpec, Workload

_TICK_S = 0.25


@dataclass
class Counters:
    """Live counts for the progress line."""

    issued: int = 0
    completed: int = 0
    failed: int = 0
    in_flight: int = 0


@dataclass(frozen=True)
class Load:
    """The shape of one level: ``concurrency`` workers, or requests at ``arrivals`` (seconds from the start)."""

    concurrency: int | None = None
    arrivals: Iterator[float] | None = field(default=None, compare=False)
    num_requests: int | None = None
    duration_s: float | None = None
    drain_s: float = 300.0


@dataclass
class LevelRun:
    """The raw outcome of one level; ``stats.summarize`` turns it into figures."""

    results: list[RequestResult]
    unfinished: int
    duration_s: float
    interrupted: bool


Tick = Callable[[Counters, float], None]


async def run_level(
    client: ChatClient, workload: Workload, load: Load, stop: asyncio.Event, on_tick: Tick | None = None
) -> LevelRun:
    """Run one level to its end (or until ``stop`` is set) and return every finished request."""
    return await _Level(client, workload, load, stop, on_tick).run()


class _Level:
    def __init__(
        self, client: ChatClient, workload: Workload, load: Load, stop: asyncio.Event, on_tick: Tick | None
    ) -> None:
        if (load.concurrency is None) == (load.arrivals is None):
            raise ValueError("a level needs either a concurrency or arrival times")
        self._client = client
        self._workload = workload
        self._load = load
        self._stop = stop
        self._on_tick = on_tick
        self._loop = asyncio.get_running_loop()
        self._origin = time.perf_counter()
        self._t0 = self._loop.time()
        self._deadline = None if load.duration_s is None else self._t0 + load.duration_s
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._last_done = self._origin
        self.counters = Counters()
        self.results: list[RequestResult] = []

    # Issuing -------------------------------------------------------------------------------------

    def _may_issue(self) -> bool:
        if self._stop.is_set():
            return False
        if self._load.num_requests is not None and self.counters.issued >= self._load.num_requests:
            return False
        return self._deadline is None or self._loop.time() < self._deadline

    def _spawn(self, spec: RequestSpec, scheduled: float | None = None) -> asyncio.Task[None]:
        self.counters.issued += 1
        self.counters.in_flight += 1
        task = asyncio.create_task(self._one(spec, scheduled))
        self._tasks.add(task)
        self._idle.clear()
        task.add_done_callback(self._forget)
        return task

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            self._idle.set()

    async def _one(self, spec: RequestSpec, scheduled: float | None) -> None:
        try:
            result = await self._client.send(spec, self._origin)
        except asyncio.CancelledError:
            self.counters.in_flight -= 1
            raise
        except Exception as exc:  # a bug here must cost one request, not the whole report
            result = RequestResult(start=0.0, error="client", detail=repr(exc))
        # The schedule's time, not the send time: a late loop must not move a request into the next phase.
        result.scheduled = scheduled
        result.session = None if spec.session is None else spec.session.id
        self.counters.in_flight -= 1
        self._last_done = time.perf_counter()
        self.results.append(result)
        if result.ok:
            self.counters.completed += 1
        else:
            self.counters.failed += 1
        self._workload.finished(spec, result.reply if result.ok else None)

    async def _open_loop(self, arrivals: Iterator[float]) -> None:
        for offset in arrivals:
            if not self._may_issue():
                return
            delay = self._t0 + offset - self._loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            spec = await self._workload.next()
            if spec is None or not self._may_issue():
                return
            self._spawn(spec, offset)

    async def _closed_loop(self, workers: int) -> None:
        async def worker() -> None:
            while self._may_issue():
                spec = await self._workload.next()
                if spec is None or not self._may_issue():
                    return
                # shielded: stopping the workers at the deadline must not cancel their requests in flight
                await asyncio.shield(self._spawn(spec))

        await asyncio.gather(*(worker() for _ in range(workers)))

    # Running -------------------------------------------------------------------------------------

    async def _tick(self, on_tick: Tick) -> None:
        while True:
            on_tick(self.counters, time.perf_counter() - self._origin)
            await asyncio.sleep(_TICK_S)

    async def run(self) -> LevelRun:
        load = self._load
        if load.arrivals is not None:
            issuer = asyncio.create_task(self._open_loop(load.arrivals))
        else:
            issuer = asyncio.create_task(self._closed_loop(load.concurrency or 1))
        stopper = asyncio.create_task(self._stop.wait())
        ticker = asyncio.create_task(self._tick(self._on_tick)) if self._on_tick else None
        issuing_ended = self._origin
        try:
            await asyncio.wait({issuer, stopper}, timeout=load.duration_s, return_when=asyncio.FIRST_COMPLETED)
            if not issuer.done():
                issuer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await issuer
            issuing_ended = time.perf_counter()
            if not self._stop.is_set() and self._tasks:
                drained = asyncio.create_task(self._idle.wait())
                await asyncio.wait({drained, stopper}, timeout=load.drain_s, return_when=asyncio.FIRST_COMPLETED)
                drained.cancel()
        finally:
            stopper.cancel()
            if ticker is not None:
                ticker.cancel()
            pending = list(self._tasks)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        interrupted = self._stop.is_set()
        end = time.perf_counter() if interrupted else max(self._last_done, issuing_ended)
        if self._on_tick:
            self._on_tick(self.counters, end - self._origin)
        return LevelRun(
            results=self.results,
            unfinished=self.counters.issued - len(self.results),
            duration_s=end - self._origin,
            interrupted=interrupted,
        )
