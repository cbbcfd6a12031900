"""Quota shared by every gateway process through Redis, with this process's counters as the fallback.

Check-and-reserve is one Lua script (EVALSHA), so concurrent reservations from any number of processes
never admit past a budget; settling is a second script that drops the hold and counts the ledger entry
in the rollups once (its id is the idempotency key). Settles are sent in batches (:mod:`.batches`, every
``book_interval_s``): one script call per tenant and UTC day for a whole batch, which adds the rollups up
once, so a request costs Redis two commands (its id, its stream entry) plus its share of the batch's thirty,
where it cost thirty on its own. A hold stays in Redis until its settle is sent, so waiting errs on the
budget's side, and each hold is still dropped in the same atomic step that counts its entry. A tenant with
no limit and no budget is not reserved in Redis at all: there is nothing to enforce.

Counted ids are kept per 10-minute slot of the entry's time for ``ids_ttl_s`` (2 h): a replay needs them
only for the few entries whose count reached Redis but whose answer was lost, replayed once Redis answers
again, so Redis holds hours of ids, not days (about 75 bytes each: 8 days of them at 100 requests/s were
~5 GB). An outage longer than that can count those few entries twice; every other entry of the outbox still
counts once. Budgets compare the rollups (settled spend, exactly what ``/v1/spend`` shows) plus open holds,
so replaying entries booked during an outage reconciles them.

While this process does not share the budgets (:attr:`RedisQuota.down`: Redis is unreachable, or came
back without the rollups, or this process has not joined it yet), the hot path stops calling it:
reservations go to the :class:`~.quota.LocalQuota`, whose baseline is the last shared totals this process
saw plus its own spend since, of which it may use its share (``fail_open=True``), or requests of tenants
with a budget are refused (``fail_open=False``; rate limits are still enforced locally). The
:class:`~.shipper.Shipper` probes Redis, replays the outbox, puts back the holds of the requests still in
flight here (:mod:`.rebuild`), and only then clears :attr:`down`.

Every write is fenced with the epoch this process joined (:mod:`.scripts`): a Redis that came back empty
refuses it with ``STALE_EPOCH``, which is handled as an outage.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from . import scripts
from .batches import Batches
from .limits import (
    QuotaExceeded,
    TenantLimits,
    budget_refusal,
    day_tag,
    ids_slot_tag,
    month_tag,
    rate_refusal,
    to_nano,
    worst_refusal,
)
from .quota import LocalQuota
from .quota_keys import KeyQuota
from .records import LedgerEntry, Reservation, new_id
from .redis_keys import RedisKeys

log = logging.getLogger("spillgate.accounting")

OUTAGE_ERRORS = (RedisError, OSError, RuntimeError)
"""What a Redis call raises when Redis is away. RuntimeError: under uvloop, a connection Redis closed while
redis-py was opening it (a restart) fails its first write with "the handler is closed"."""
_RETRY_S = 1.0
_LIMIT_NAMES = (
    "requests_per_minute",
    "tokens_per_minute",
    "usd_per_day",
    "usd_per_month",
    "hosted_usd_per_day",
    "hosted_usd_per_month",
)
_MODE_DROP, _MODE_SETTLE, _MODE_RELEASE = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Booking:
    """What one settle, release or replay does in Redis: drop ``hold_id`` (if any) the ``mode`` way and count
    ``entry`` (if any) once, at ``now``."""

    tenant: str
    entry: LedgerEntry | None
    hold_id: str
    mode: int
    now: float

    @property
    def at(self) -> float:
        """The time whose UTC day, month and id slot the entry is counted in."""
        return self.entry.time if self.entry is not None else self.now


def make_client(url: str, *, timeout_s: float = 0.5, max_connections: int = 64) -> aioredis.Redis:
    """A client for the hot path: short timeouts and no retries, so an outage costs one failed call,
    after which the quota stops calling Redis until the shipper sees it back. Its pool makes a burst of
    reservations wait for a connection (up to ``4 * timeout_s``) instead of failing as if Redis were down."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=4 * timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        # One retry on a broken connection: after Redis restarts every pooled connection is dead, and each
        # must not count as an outage (the next attempt reconnects). Timeouts are not retried.
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    )
    return aioredis.Redis.from_pool(pool)


def _micros(now: float) -> int:
    return int(now * 1_000_000)


def _limit(value: float | int | None, *, money: bool = False) -> int:
    if value is None:
        return -1
    return to_nano(value) if money else int(value)


class RedisQuota:
    def __init__(
        self,
        client: aioredis.Redis,
        local: LocalQuota | None = None,
        *,
        key_prefix: str = "spillgate",
        fail_open: bool = True,
        hold_ttl_s: float = 60.0,
        series_ttl_s: int = 2 * 86_400,
        ids_ttl_s: int = 2 * 3600,
        stream_maxlen: int = 100_000,
        book_interval_s: float = 0.02,
    ) -> None:
        self.client = client
        self.local = local or LocalQuota()
        self.keys = RedisKeys(key_prefix)
        self.fail_open = fail_open
        self.hold_ttl_s = hold_ttl_s
        self._ttls = (40 * 86_400, 400 * 86_400, series_ttl_s, ids_ttl_s, stream_maxlen)
        self._reserve = client.register_script(scripts.RESERVE)
        self._record = client.register_script(scripts.RECORD)
        self._hold = client.register_script(scripts.HOLD)
        self._known_tenants: set[str] = set()
        self.bookings: Batches[Booking] = Batches(self._send_bookings, interval_s=book_interval_s)
        """Settles, releases and counts on their way to Redis (:meth:`booked` sends them at once)."""
        self.key_quota = KeyQuota(client, key_prefix)
        """Managed keys' own limits, held besides their tenants' (in Redis too)."""
        self.down = True
        """Not sharing the budgets in Redis: unreachable, or not (re)joined yet (the shipper joins at start)."""
        self.epoch = ""
        """The epoch of the shared rollups this process joined: every write is fenced with it."""
        self.rejoining = False
        """What this process knows is back in Redis, and it waits for the other processes to have done the same:
        requests under a budget wait meanwhile, since admitting them here would hide them from the others, and
        admitting them in Redis would miss what the others have not put back yet."""
        self._rejoined = asyncio.Event()
        self.processes: Callable[[], int] = lambda: 1
        """How many gateway processes spend these budgets (this one and its peers, as last seen): while Redis
        is away each may spend only its share of what was left."""
        self.processes_at_loss = 1
        """:attr:`processes` when this process last stopped sharing (its peers may drop out of it meanwhile)."""
        self.pending_releases: list[Reservation] = []
        """Reservations whose Redis hold is to be dropped, released while Redis was away without an entry."""
        self._open: dict[str, Reservation] = {}
        """Requests in progress here that hold budget: the Redis holds are renewed by :meth:`renew_holds`, so
        they lapse soon after this process stops renewing them (killed, or cut off from Redis), not an hour
        later; all are put back by :meth:`put_back_holds` when Redis comes back without them."""

    @property
    def degraded(self) -> bool:
        return self.down

    @property
    def ttls(self) -> tuple[int, int, int, int, int]:
        """Seconds the day and month rollups, series and ids are kept; the stream's length."""
        return self._ttls

    def lost(self, exc: BaseException | str) -> None:
        """Stop sharing: Redis failed a call, or refused it as fenced by a lost epoch."""
        if not self.down:
            self.processes_at_loss = self.expected_processes()
            what = "lost the shared rollups" if "STALE_EPOCH" in str(exc) else f"unreachable ({exc})"
            log.warning("Redis %s: quotas fall back to this process's share until it is back", what)
        self.down = True

    def rejoin(self, rejoining: bool = True) -> None:
        """Everything this process knows is about to be put back: requests under a budget wait from now on
        (``False``: the attempt failed, and they are admitted within this process's share again)."""
        self.rejoining = rejoining
        if rejoining:
            self._rejoined.clear()
        else:
            self._rejoined.set()

    def restored(self) -> None:
        if self.down:
            log.info("Redis is shared again (epoch %s)", self.epoch)
        self.down = False
        self.rejoin(False)
        self._known_tenants.clear()  # Redis may have come back empty

    def expected_processes(self) -> int:
        """The processes spending these budgets: the most of those last seen and of those seen now."""
        return max(1, self.processes_at_loss if self.down else 1, self.processes())

    # Reserve -----------------------------------------------------------------------------------------

    async def reserve(
        self, tenant: str, limits: TenantLimits, *, tokens: int, worst_case_usd: float, hosted: bool, now: float
    ) -> Reservation:
        if limits.key_limits is None:
            return await self._reserve_tenant(tenant, limits, tokens, worst_case_usd, hosted, now)
        hold = await self.key_quota.reserve(
            limits, tokens=tokens, worst_case_usd=worst_case_usd, now=now, shared=not self.down
        )
        try:
            reservation = await self._reserve_tenant(tenant, limits, tokens, worst_case_usd, hosted, now)
        except QuotaExceeded:
            await self.key_quota.give_back(hold, now)
            raise
        self.key_quota.attach(reservation.id, hold)
        return reservation

    async def _reserve_tenant(
        self, tenant: str, limits: TenantLimits, tokens: int, worst_case_usd: float, hosted: bool, now: float
    ) -> Reservation:
        while True:
            while self.rejoining and limits.has_budget:
                await self._rejoined.wait()
            if limits.unlimited or self.down:
                return self._reserve_locally(tenant, limits, tokens, worst_case_usd, hosted, now)
            try:
                return await self._reserve_shared(tenant, limits, tokens, worst_case_usd, hosted, now)
            except OUTAGE_ERRORS as exc:
                self.lost(exc)  # then as above: this process may be rejoining by now (a call can wait seconds)

    async def _reserve_shared(
        self, tenant: str, limits: TenantLimits, tokens: int, worst_case_usd: float, hosted: bool, now: float
    ) -> Reservation:
        hold_id, day, month = new_id(), day_tag(now), month_tag(now)
        keys = self.keys
        reply = await self._reserve(
            keys=[
                keys.day(tenant, day),
                keys.month(tenant, month),
                keys.rate(tenant),
                keys.holds(tenant),
                keys.hold_expiry(tenant),
                keys.epoch,
            ],
            args=[
                keys.base(tenant),
                _micros(now),
                hold_id,
                tokens,
                to_nano(worst_case_usd),
                int(hosted),
                _limit(limits.requests_per_minute),
                _limit(limits.tokens_per_minute),
                _limit(limits.usd_per_day, money=True),
                _limit(limits.usd_per_month, money=True),
                _limit(limits.hosted_usd_per_day, money=True),
                _limit(limits.hosted_usd_per_month, money=True),
                _micros(now + self.hold_ttl_s),
                day,
                month,
                self._ttls[0],
                self._ttls[1],
                self.epoch,
            ],
        )
        if reply[0] == 0:
            raise self._refusal(reply[1:], limits, tokens, worst_case_usd, now)
        self.local.adopt(tenant, "d" + day, int(reply[1]), int(reply[3]))
        self.local.adopt(tenant, "m" + month, int(reply[2]), int(reply[4]))
        self.local.adopt_rates(tenant, float(reply[5] or 0) / 1e6, float(reply[6] or 0) / 1e6)
        reservation = Reservation.made(
            hold_id,
            tenant,
            limits,
            tokens=tokens,
            worst_case_usd=worst_case_usd,
            hosted=hosted,
            at=now,
            day=day,
            month=month,
            shared=True,
        )
        self._open[hold_id] = reservation
        return reservation

    async def renew_holds(self, now: float) -> None:
        """Push back the lapse of every hold still open here by ``hold_ttl_s`` (one pipeline)."""
        if not self._open or self.down:
            return
        lapse = _micros(now + self.hold_ttl_s)
        async with self.client.pipeline(transaction=False) as pipe:
            for reservation in self._open.values():
                pipe.zadd(self.keys.hold_expiry(reservation.tenant), {reservation.id: lapse}, xx=True)
            await pipe.execute()

    def _reserve_locally(
        self, tenant: str, limits: TenantLimits, tokens: int, worst_case_usd: float, hosted: bool, now: float
    ) -> Reservation:
        if self.down and not self.fail_open and limits.has_budget:
            raise QuotaExceeded(
                "accounting_unavailable",
                "Spend accounting is unavailable, so requests under a budget are refused until it returns.",
                _RETRY_S,
            )
        share = 1.0 / self.expected_processes() if self.down else 1.0
        reservation = self.local.reserve_now(
            tenant, limits, tokens=tokens, worst_case_usd=worst_case_usd, hosted=hosted, now=now, share=share
        )
        if limits.has_budget:
            self._open[reservation.id] = reservation  # Redis must learn of its hold when this process rejoins
        return reservation

    @staticmethod
    def _refusal(
        verdicts: Sequence[int], limits: TenantLimits, tokens: int, worst_case_usd: float, now: float
    ) -> QuotaExceeded:
        refusals = []
        for name, verdict in zip(_LIMIT_NAMES, verdicts, strict=True):
            if verdict == -2:
                continue
            if name.endswith("per_minute"):
                cost = 1 if name == "requests_per_minute" else tokens
                refusals.append(rate_refusal(name, limits, cost, None if verdict == -1 else verdict / 1e6))
            else:
                refusals.append(budget_refusal(name, limits, worst_case_usd, now))
        return worst_refusal(refusals)

    # Settle and release --------------------------------------------------------------------------------

    async def settle(self, reservation: Reservation, entry: LedgerEntry) -> bool:
        if (key_hold := self.key_quota.take(reservation.id)) is not None:
            await self.key_quota.settle(key_hold, entry)
        hold_id = self._close(reservation)
        if not reservation.shared:
            await self.local.settle(reservation, entry)
            return await self._try_record(reservation.tenant, entry, hold_id, _MODE_DROP, entry.time)
        if await self._try_record(reservation.tenant, entry, hold_id, _MODE_SETTLE, entry.time):
            return True
        self.local.unhold_shared(reservation)
        self.local.add_spend(entry)  # its outbox row carries the hold id and drops it on replay
        return False

    async def release(self, reservation: Reservation, entry: LedgerEntry | None, now: float) -> bool:
        if (key_hold := self.key_quota.take(reservation.id)) is not None:
            await self.key_quota.give_back(key_hold, now)
        hold_id = self._close(reservation)
        if not reservation.shared:
            await self.local.release(reservation, entry, now)
            if entry is None and not hold_id:
                return False
            if await self._try_record(reservation.tenant, entry, hold_id, _MODE_DROP, now):
                return True
            if entry is None:
                self.pending_releases.append(reservation)
            return False
        if await self._try_record(reservation.tenant, entry, hold_id, _MODE_RELEASE, now):
            return True
        self.local.unhold_shared(reservation)
        if entry is not None:
            self.local.add_spend(entry)  # its outbox row carries the hold id and drops it on replay
        else:
            self.pending_releases.append(reservation)
        return False

    def _close(self, reservation: Reservation) -> str:
        """Stop tracking ``reservation``: the id of the hold Redis may have of it ('' when none)."""
        tracked = self._open.pop(reservation.id, None) is not None
        return reservation.id if reservation.shared or tracked else ""

    async def count(self, entry: LedgerEntry) -> bool:
        """An entry without a reservation: counted in Redis now, or locally and replayed later."""
        if await self._try_record(entry.tenant, entry, "", _MODE_DROP, entry.time):
            return True
        self.local.add_spend(entry)
        return False

    async def _try_record(self, tenant: str, entry: LedgerEntry | None, hold_id: str, mode: int, now: float) -> bool:
        """Book it in Redis with the next batch unless Redis is away; False when it is, or the batch fails."""
        if self.down:
            return False
        return await self.bookings.send(Booking(tenant, entry, hold_id, mode, now))

    async def booked(self) -> None:
        """Send the bookings that wait now: this process's reads then see every settle it has made."""
        await self.bookings.flush()

    async def _send_bookings(self, bookings: Sequence[Booking]) -> bool:
        if self.down:
            return False
        new = {b.tenant for b in bookings if b.entry is not None} - self._known_tenants
        calls = self._record_calls(bookings)
        try:
            if len(calls) == 1 and not new:  # the usual batch: one round trip (a pipeline adds SCRIPT EXISTS)
                await self._record(keys=calls[0][0], args=calls[0][1])
            else:
                async with self.client.pipeline(transaction=False) as pipe:
                    for keys, args in calls:
                        await self._record(keys=keys, args=args, client=pipe)
                    if new:
                        pipe.sadd(self.keys.tenants, *new)
                    await pipe.execute()
        except OUTAGE_ERRORS as exc:
            self.lost(exc)
            return False
        self._known_tenants |= new
        return True

    async def run_records(self, bookings: Sequence[Booking], pipe: Pipeline) -> None:
        """Queue on ``pipe`` the script calls that drop the holds of ``bookings`` and count their entries."""
        for keys, args in self._record_calls(bookings):
            await self._record(keys=keys, args=args, client=pipe)

    def _record_calls(self, bookings: Sequence[Booking]) -> list[tuple[list[str], list[str | int | bytes]]]:
        """The record script's keys and arguments: one call per tenant, UTC day and id slot of ``bookings``,
        which drops their holds and counts their entries once each, atomically."""
        groups: dict[tuple[str, str, str, str], list[Booking]] = {}
        for booking in bookings:
            at = booking.at
            groups.setdefault((booking.tenant, day_tag(at), month_tag(at), ids_slot_tag(at)), []).append(booking)
        keys = self.keys
        day_ttl, month_ttl, series_ttl, ids_ttl, maxlen = self._ttls
        calls: list[tuple[list[str], list[str | int | bytes]]] = []
        for (tenant, day, month, slot), group in groups.items():
            args: list[str | int | bytes] = [keys.base(tenant), _micros(max(b.now for b in group))]
            args += [day_ttl, month_ttl, series_ttl, ids_ttl, maxlen, self.epoch]
            for booking in group:
                args += _booking_args(booking)
            script_keys = [
                keys.day(tenant, day),
                keys.month(tenant, month),
                keys.rate(tenant),
                keys.holds(tenant),
                keys.hold_expiry(tenant),
                keys.series(tenant, day),
                keys.ids(tenant, slot),
                keys.stream(tenant),
                keys.epoch,
            ]
            calls.append((script_keys, args))
        return calls

    # Replay (called by the shipper) --------------------------------------------------------------------

    async def replay(self, rows: Sequence[tuple[LedgerEntry, str]], now: float) -> None:
        """Count entries booked while Redis was away (and drop the holds they settle), in one pipeline."""
        async with self.client.pipeline(transaction=False) as pipe:
            await self.run_records(
                [Booking(entry.tenant, entry, hold_id, _MODE_DROP, now) for entry, hold_id in rows], pipe
            )
            pipe.sadd(self.keys.tenants, *{entry.tenant for entry, _ in rows})
            await pipe.execute()

    async def put_back_holds(self, now: float) -> None:
        """Hold in Redis again what the requests in flight here hold: those reserved there (a Redis that came
        back empty lost them) and those reserved here while it was away. Holds Redis has are left as they are.
        Called while :attr:`rejoining`, so no new budget hold appears once the last batch is sent."""
        keys, lapse = self.keys, _micros(now + self.hold_ttl_s)
        done: set[str] = set()
        while batch := [r for r in self._open.values() if r.id not in done]:
            async with self.client.pipeline(transaction=False) as pipe:
                for r in batch:
                    usd = to_nano(r.worst_case_usd)
                    await self._hold(
                        keys=[
                            keys.day(r.tenant, r.day),
                            keys.month(r.tenant, r.month),
                            keys.rate(r.tenant),
                            keys.holds(r.tenant),
                            keys.hold_expiry(r.tenant),
                            keys.epoch,
                        ],
                        args=[
                            keys.base(r.tenant),
                            _micros(now),
                            r.id,
                            usd,
                            usd if r.hosted else 0,
                            lapse,
                            r.day,
                            r.month,
                            self._ttls[0],
                            self._ttls[1],
                            self.epoch,
                        ],
                        client=pipe,
                    )
                await pipe.execute()
            done.update(r.id for r in batch)

    async def replay_releases(self, now: float) -> None:
        """Drop the Redis holds of the reservations released while Redis was away, in one pipeline."""
        if not self.pending_releases:
            return
        releases = list(self.pending_releases)
        async with self.client.pipeline(transaction=False) as pipe:
            await self.run_records([Booking(r.tenant, None, r.id, _MODE_DROP, now) for r in releases], pipe)
            await pipe.execute()
        del self.pending_releases[: len(releases)]

    async def probe(self) -> bool:
        try:
            await self.client.ping()
        except OUTAGE_ERRORS:
            return False
        return True


def _booking_args(booking: Booking) -> list[str | int | bytes]:
    """The 14 values of one booking in the record script's ARGV."""
    head: list[str | int | bytes] = [_micros(booking.now), booking.hold_id, booking.mode]
    entry = booking.entry
    if entry is None:
        return [*head, 0, "", "", "", 0, 0, 0, 0, 0, 0, b""]
    at = entry.time
    return [
        *head,
        entry.tokens,
        entry.entry_id,
        entry.kind,
        entry.backend,
        to_nano(entry.cost_usd),
        to_nano(entry.hosted_equivalent_usd),
        entry.prompt_tokens,
        entry.cached_tokens,
        entry.completion_tokens,
        int(at % 86_400 // 60),  # minute of the UTC day
        orjson.dumps(entry),
    ]
