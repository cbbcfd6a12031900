"""GPU cost as rent: a pool costs its replicas' hourly price whether they are busy or idle.

A replica request's own price is the GPU time it takes from everyone else: its uncached prompt tokens at the
pool's prefill rate plus its output tokens at the pool's full-batch decode rate, priced at the GPU-hour. That
is what the ledger books per request, and what budgets count. The rent is what the operator pays: replicas x
$/hour x hours since the gateway started (or since the pool's size last changed). Over the same time the rent
is shared among tenants and routes by their share of the GPU time used, so their shares add up to the rent;
the part no request used is the idle cost, shown apart. With that, savings are what the same traffic would
have cost on the route's hosted model (or its reference price), minus the rent and the hosted spend.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class PoolPrice:
    """What one pool costs and how fast one of its replicas works, from the config."""

    name: str
    replicas: int
    usd_per_hour: float
    """Per replica."""
    prefill_tokens_per_s: float
    output_tokens_per_s: float

    def gpu_seconds(self, uncached_prompt_tokens: int, completion_tokens: int) -> float:
        """Replica-seconds one request takes: its prefill plus its share of the decode steps at full batch."""
        return max(0, uncached_prompt_tokens) / self.prefill_tokens_per_s + max(0, completion_tokens) / (
            self.output_tokens_per_s
        )

    def usd(self, gpu_seconds: float) -> float:
        return gpu_seconds * self.usd_per_hour / SECONDS_PER_HOUR


@dataclass(slots=True)
class _Usage:
    gpu_seconds: float = 0.0
    tokens: int = 0
    hosted_equivalent_usd: float = 0.0
    """Of the requests with a baseline (a hosted model or reference price on their route)..."""
    baselined_tokens: int = 0
    """...and their tokens."""


@dataclass(slots=True)
class _PoolBook:
    price: PoolPrice
    since: float
    """When the current size and price took effect (``time.time()``)."""
    accrued_usd: float = 0.0
    """Rent of earlier sizes and prices."""
    accrued_replica_s: float = 0.0
    started: float = 0.0
    """When this pool's rent began."""
    usage: dict[tuple[str, str], _Usage] = field(default_factory=dict)
    """By (tenant, route)."""


@dataclass(frozen=True, slots=True)
class Share:
    """A tenant's or route's part of a pool's rent."""

    gpu_seconds: float
    rent_usd: float
    tokens: int
    hosted_equivalent_usd: float


@dataclass(frozen=True, slots=True)
class PoolRent:
    """A pool's rent from ``since`` to ``until``, and who used it."""

    pool: str
    replicas: int
    usd_per_hour: float
    since: float
    until: float
    rent_usd: float
    replica_seconds: float
    busy_seconds: float
    tokens: int
    hosted_equivalent_usd: float
    """What the requests this pool served would have cost on their routes' hosted models (or reference prices),
    for the requests whose route has one..."""
    baselined_tokens: int
    """...and their tokens."""
    by_tenant: Mapping[str, Share]
    by_route: Mapping[str, Share]

    @property
    def utilization(self) -> float:
        """Busy replica-seconds over rented ones (above 1 when the configured rates undercount the GPUs' work)."""
        return self.busy_seconds / self.replica_seconds if self.replica_seconds > 0 else 0.0

    @property
    def idle_usd(self) -> float:
        return self.rent_usd * max(0.0, 1.0 - self.utilization)

    @property
    def usd_per_mtok(self) -> float | None:
        """What a million tokens served here cost at the utilization seen."""
        return self.rent_usd / self.tokens * 1e6 if self.tokens else None

    @property
    def hosted_usd_per_mtok(self) -> float | None:
        """What a million of the same tokens cost on the routes' hosted models (tokens with a baseline only)."""
        return self.hosted_equivalent_usd / self.baselined_tokens * 1e6 if self.baselined_tokens else None

    @property
    def break_even_utilization(self) -> float | None:
        """The utilization at which this pool's tokens cost what the hosted model charges for them: traffic grows
        with utilization, the rent does not. Judged on the hosted price per token of the traffic with a
        baseline, applied to all of it."""
        hosted = self.hosted_usd_per_mtok
        if not hosted or not self.busy_seconds:
            return None
        return self.utilization * self.rent_usd / (hosted * self.tokens / 1e6)


class RentBook:
    """Accrues each pool's rent and the GPU time its requests used, for the life of the gateway process."""

    def __init__(self, pools: Iterable[PoolPrice], now: float) -> None:
        self._pools: dict[str, _PoolBook] = {}
        self.configure(pools, now)

    def configure(self, pools: Iterable[PoolPrice], now: float) -> None:
        """A new config version: a pool whose size or price changed accrues at the new rate from ``now``; a
        removed pool stops accruing."""
        kept: dict[str, _PoolBook] = {}
        for price in pools:
            book = self._pools.get(price.name)
            if book is None:
                book = _PoolBook(price, since=now, started=now)
            elif book.price != price:
                book.accrued_usd += _rent(book.price, book.since, now)
                book.accrued_replica_s += book.price.replicas * max(0.0, now - book.since)
                book.price, book.since = price, now
            kept[price.name] = book
        self._pools = kept

    def price(self, pool: str) -> PoolPrice | None:
        book = self._pools.get(pool)
        return book.price if book is not None else None

    def used(
        self, pool: str, tenant: str, route: str, gpu_seconds: float, tokens: int, hosted_equivalent_usd: float | None
    ) -> None:
        """A request ``pool`` served took ``gpu_seconds`` of it; ``hosted_equivalent_usd`` is None when its route
        has no baseline to compare with."""
        book = self._pools.get(pool)
        if book is None:
            return
        usage = book.usage.get((tenant, route))
        if usage is None:
            usage = book.usage[(tenant, route)] = _Usage()
        usage.gpu_seconds += gpu_seconds
        usage.tokens += tokens
        if hosted_equivalent_usd is not None:
            usage.hosted_equivalent_usd += hosted_equivalent_usd
            usage.baselined_tokens += tokens

    def report(self, now: float) -> list[PoolRent]:
        return [_report(book, now) for book in self._pools.values()]


def _rent(price: PoolPrice, since: float, until: float) -> float:
    return price.replicas * price.usd_per_hour * max(0.0, until - since) / SECONDS_PER_HOUR


def _report(book: _PoolBook, now: float) -> PoolRent:
    rent = book.accrued_usd + _rent(book.price, book.since, now)
    busy = sum(u.gpu_seconds for u in book.usage.values())
    by_tenant: dict[str, list[_Usage]] = {}
    by_route: dict[str, list[_Usage]] = {}
    for (tenant, route), usage in book.usage.items():
        by_tenant.setdefault(tenant, []).append(usage)
        by_route.setdefault(route, []).append(usage)
    return PoolRent(
        pool=book.price.name,
        replicas=book.price.replicas,
        usd_per_hour=book.price.usd_per_hour,
        since=book.started,
        until=now,
        rent_usd=rent,
        replica_seconds=book.accrued_replica_s + book.price.replicas * max(0.0, now - book.since),
        busy_seconds=busy,
        tokens=sum(u.tokens for u in book.usage.values()),
        hosted_equivalent_usd=sum(u.hosted_equivalent_usd for u in book.usage.values()),
        baselined_tokens=sum(u.baselined_tokens for u in book.usage.values()),
        by_tenant=_shares(by_tenant, rent, busy),
        by_route=_shares(by_route, rent, busy),
    )


def _shares(groups: Mapping[str, list[_Usage]], rent: float, busy: float) -> dict[str, Share]:
    """Each group's part of the rent, by its share of the GPU time used: the parts add up to the rent."""
    shares = {}
    for name, usages in sorted(groups.items()):
        seconds = sum(u.gpu_seconds for u in usages)
        shares[name] = Share(
            gpu_seconds=seconds,
            rent_usd=rent * seconds / busy if busy > 0 else 0.0,
            tokens=sum(u.tokens for u in usages),
            hosted_equivalent_usd=sum(u.hosted_equivalent_usd for u in usages),
        )
    return shares
