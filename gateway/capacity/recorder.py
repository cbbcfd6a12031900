"""What the gateway has seen of each pool: arrivals, request sizes, overflow, and its replicas' load.

Times are ``time.perf_counter()`` seconds, the clock :class:`~gateway.serving.exchange.Attempt` stamps, and always
passed in as ``now``: the recorder never reads a clock, so tests drive it with invented times. Everything is kept in
:class:`~gateway.capacity.series.BucketSeries`, so memory is bounded by the lookback, not by the traffic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from spillgate.backends.backend import Backend
from spillgate.gateway.accounting.bookkeeping import slo_result
from spillgate.gateway.capacity.advice import (
    BUCKETS_PER_WINDOW,
    PoolMeasures,
    ReplicaWindow,
    measured_output_tps,
    peak_rate,
    pressure_floor,
)
from spillgate.gateway.capacity.series import BucketSeries
from spillgate.gateway.control.config import CapacityConfig, GatewayConfig, PoolConfig
from spillgate.gateway.plan.inputs import HostedPrices
from spillgate.gateway.serving.exchange import Attempt


@dataclass(slots=True)
class _PoolSeries:
    """A pool's demand by arrival time, in buckets a tenth of a rate window wide."""

    demand: BucketSeries
    """Requests its replicas served, plus those spilled to hosted as overflow or refused as over capacity (shared
    among the route's pools)."""
    overflow: BucketSeries
    overflow_usd: BucketSeries
    refused: BucketSeries
    sized: BucketSeries
    """Of ``demand``, the requests whose usage came back: the denominator of the token means."""
    input_tokens: BucketSeries
    output_tokens: BucketSeries

    @classmethod
    def new(cls, width_s: float, slots: int) -> _PoolSeries:
        return cls(*(BucketSeries(width_s, slots) for _ in range(7)))


@dataclass(slots=True)
class _ReplicaSeries:
    """One replica per rate window: the :class:`~gateway.capacity.advice.ReplicaWindow` figures."""

    output_tokens: BucketSeries
    finished: BucketSeries
    met_slo: BucketSeries
    samples: BucketSeries
    saturated: BucketSeries

    @classmethod
    def new(cls, width_s: float, slots: int) -> _ReplicaSeries:
        return cls(*(BucketSeries(width_s, slots) for _ in range(5)))

    def complete_windows(self, now: float) -> list[ReplicaWindow]:
        """Every window of the lookback but the one under way (its throughput is not all in yet)."""
        columns = [s.recent(now)[:-1] for s in (self.output_tokens, self.finished, self.met_slo)]
        columns += [s.recent(now)[:-1] for s in (self.samples, self.saturated)]
        return [ReplicaWindow(*row) for row in zip(*columns, strict=True)]


@dataclass(slots=True)
class _Pressure:
    """A pool's load as last sampled, and how long it has been under pressure without a break."""

    since: float | None = None
    """The first sample of the current unbroken run of pressure; ``None`` when the last sample had none."""
    replicas: int = 0
    queue_depth: int = 0
    kv_usage: float = 0.0
    kept_floor: int | None = None
    """The replica count sustained pressure last called for..."""
    kept_at: float = 0.0
    """...and when: it holds for the lookback, so capacity added for pressure is not taken away at once."""


def met_slo(attempt: Attempt) -> bool | None:
    """Whether the request met its tenant's TTFT and TPOT targets, judged as ``spillgate_slo_requests`` counts
    them; ``None`` without a first token (nothing to judge)."""
    result = slo_result(attempt)
    return None if result is None else result == "met"


def saturated(backend: Backend) -> bool:
    """The replica runs at its limit (requests queue there, or it runs ``max_running``), and all its load is this
    process's: then what this process sees it produce is what it can produce."""
    load = backend.load
    at_limit = load.queued > 0 or (backend.max_running > 0 and load.running >= backend.max_running)
    alone = backend.peers.in_flight == 0 and backend.external_load == 0
    return backend.healthy and at_limit and alone


def _usage_tokens(attempt: Attempt) -> tuple[int, int] | None:
    usage = attempt.usage or {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        return prompt, completion
    return None


@dataclass
class CapacityRecorder:
    """Demand per pool and throughput per replica over the lookback, for :func:`~gateway.capacity.advice.advise`."""

    settings: CapacityConfig = field(default_factory=CapacityConfig)
    since: float = 0.0
    """When the measurements (re)started: the mean rate is over the time since then, at most the lookback."""
    _pools: dict[str, _PoolSeries] = field(default_factory=dict)
    _replicas: dict[str, _ReplicaSeries] = field(default_factory=dict)
    _pressure: dict[str, _Pressure] = field(default_factory=dict)
    _route_pools: dict[str, tuple[str, ...]] = field(default_factory=dict)
    _dedicated: frozenset[str] = frozenset()
    """Pools dedicated to a tenant: another tenant's overflow was never theirs to take."""
    _configured: bool = False

    @property
    def bucket_s(self) -> float:
        return self.settings.rate_window_s / BUCKETS_PER_WINDOW

    def configure(self, config: GatewayConfig, replica_names: Iterable[str], now: float) -> None:
        """Follow a config version: new pools start empty, removed ones (and removed replicas) are forgotten, and
        a new rate window or lookback starts every measurement afresh (the buckets no longer fit)."""
        settings = config.capacity
        old = self.settings
        if not self._configured or (settings.rate_window_s, settings.lookback_s) != (old.rate_window_s, old.lookback_s):
            self._pools.clear()
            self._replicas.clear()
            self.since = now
        self.settings = settings
        self._configured = True
        names = {pool.name for pool in config.pools}
        self._route_pools = dict(route_pools(config))
        self._dedicated = frozenset(pool for tenant in config.tenants for pool in tenant.dedicated_pools)
        slots = math.ceil(settings.lookback_s / self.bucket_s)
        for name in names - self._pools.keys():
            self._pools[name] = _PoolSeries.new(self.bucket_s, slots)
        for gone in self._pools.keys() - names:
            del self._pools[gone]
        self._pressure = {name: self._pressure.get(name, _Pressure()) for name in names}
        keep = set(replica_names)
        self._replicas = {name: series for name, series in self._replicas.items() if name in keep}

    def _replica(self, name: str) -> _ReplicaSeries:
        series = self._replicas.get(name)
        if series is None:
            window = self.settings.rate_window_s
            series = self._replicas[name] = _ReplicaSeries.new(window, math.ceil(self.settings.lookback_s / window))
        return series

    def finished(self, attempt: Attempt, now: float) -> None:
        """Count a finished request: as demand of its replica's pool, or, spilled to hosted as overflow, of the
        pools of its route (demand they could not take; a ``complex`` spill was never theirs)."""
        backend = attempt.served_by
        if backend is None:
            return
        if backend.kind == "replica":
            pools: Sequence[str] = (backend.pool,)
        elif attempt.reason == "overflow":
            pools = self._unserved_pools(attempt)
        else:
            return
        pools = [name for name in pools if name in self._pools]
        if not pools:
            return
        share = 1.0 / len(pools)
        tokens = _usage_tokens(attempt)
        arrived = attempt.started
        for name in pools:
            series = self._pools[name]
            series.demand.add(arrived, share)
            if tokens is not None:
                series.sized.add(arrived, share)
                series.input_tokens.add(arrived, share * tokens[0])
                series.output_tokens.add(arrived, share * tokens[1])
            if backend.kind == "hosted":
                series.overflow.add(arrived, share)
                series.overflow_usd.add(arrived, share * (attempt.cost_usd or 0.0))
        verdict = met_slo(attempt)
        if backend.kind == "replica" and tokens is not None and verdict is not None:
            replica = self._replica(backend.name)
            replica.output_tokens.add(now, tokens[1])
            replica.finished.add(now)
            replica.met_slo.add(now, 1.0 if verdict else 0.0)

    def refused(self, attempt: Attempt) -> None:
        """Count a request refused because no backend was predicted to meet its SLO (a route that rejects what
        it cannot serve in time): demand its route's pools did not have the capacity for, as an overflow is."""
        pools = [name for name in self._unserved_pools(attempt) if name in self._pools]
        for name in pools:
            series = self._pools[name]
            series.demand.add(attempt.started, 1.0 / len(pools))
            series.refused.add(attempt.started, 1.0 / len(pools))

    def _unserved_pools(self, attempt: Attempt) -> list[str]:
        """The pools a request their replicas did not serve (spilled as overflow, refused) was demand of: its
        route's that serve its tenant (its dedicated ones, or those dedicated to nobody)."""
        own = attempt.tenant.dedicated_pools if attempt.tenant is not None else frozenset()
        route = self._route_pools.get(attempt.route, ())
        return [pool for pool in route if (pool in own if own else pool not in self._dedicated)]

    def sample(self, backends: Iterable[Backend], now: float) -> None:
        """Take one sample of every pool's queue depth and KV usage, and of whether each replica is saturated."""
        members: dict[str, list[Backend]] = {name: [] for name in self._pools}
        for backend in backends:
            if backend.kind == "replica" and backend.pool in members:
                members[backend.pool].append(backend)
        settings = self.settings
        for name, replicas in members.items():
            healthy = [b for b in replicas if b.healthy]
            queued = sum(b.load.queued for b in replicas)
            kv = sum(b.load.token_usage for b in healthy) / len(healthy) if healthy else 0.0
            state = self._pressure[name]
            under = queued > 0 or kv > settings.kv_high
            if not under or len(replicas) != state.replicas:
                state.since = None  # a resized pool earns its own sustain_s before asking for more
            if under and state.since is None:
                state.since = now
            state.replicas, state.queue_depth, state.kv_usage = len(replicas), queued, kv
            floor = pressure_floor(len(replicas), self._pressure_s(state, now), settings.sustain_s)
            if floor is not None:
                state.kept_floor = max(floor, self._kept_floor(state, now) or 0)
                state.kept_at = now
            for backend in replicas:
                replica = self._replica(backend.name)
                replica.samples.add(now)
                replica.saturated.add(now, 1.0 if saturated(backend) else 0.0)

    @staticmethod
    def _pressure_s(state: _Pressure, now: float) -> float:
        return 0.0 if state.since is None else now - state.since

    def _kept_floor(self, state: _Pressure, now: float) -> int | None:
        return state.kept_floor if now - state.kept_at <= self.settings.lookback_s else None

    def measures(
        self,
        pool: PoolConfig,
        backends: Iterable[Backend],
        hosted_price: HostedPrices | None,
        now: float,
    ) -> PoolMeasures:
        """Everything measured of ``pool`` over the lookback; a pool not configured (yet) reads as idle."""
        settings = self.settings
        series = self._pools.get(pool.name) or _PoolSeries.new(self.bucket_s, 1)
        demand = series.demand.recent(now)
        peak, age_buckets = peak_rate(demand, self.bucket_s, BUCKETS_PER_WINDOW)
        covered = min(settings.lookback_s, max(now - self.since, settings.rate_window_s))
        sized = series.sized.total(now)
        replicas = [b for b in backends if b.kind == "replica" and b.pool == pool.name]
        tracked = [self._replicas[b.name] for b in replicas if b.name in self._replicas]
        windows = [window for series in tracked for window in series.complete_windows(now)]
        measured, counted = measured_output_tps(windows, settings.rate_window_s)
        state = self._pressure.get(pool.name, _Pressure())
        return PoolMeasures(
            pool=pool.name,
            replicas=len(replicas),
            healthy_replicas=sum(1 for b in replicas if b.healthy),
            peak_rps=peak,
            peak_age_s=age_buckets * self.bucket_s,
            mean_rps=sum(demand) / covered,
            requests=sum(demand),
            overflow_requests=series.overflow.total(now),
            overflow_usd=series.overflow_usd.total(now),
            refused_requests=series.refused.total(now),
            mean_input_tokens=series.input_tokens.total(now) / sized if sized else None,
            mean_output_tokens=series.output_tokens.total(now) / sized if sized else None,
            configured_output_tps=pool.output_tokens_per_s,
            measured_output_tps=measured,
            measured_windows=counted,
            queue_depth=state.queue_depth,
            kv_usage=state.kv_usage,
            pressure_s=self._pressure_s(state, now),
            kept_floor=self._kept_floor(state, now),
            gpu_usd_per_hour=pool.gpu_usd_per_hour,
            hosted_price=hosted_price,
        )


def route_pools(config: GatewayConfig) -> Mapping[str, tuple[str, ...]]:
    """The pools each route's replicas come from."""
    names = {pool.name for pool in config.pools}
    return {r.name: tuple(t for t in r.targets if t in names) for r in config.routes}
