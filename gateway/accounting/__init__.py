"""Accounting: per-tenant rate limits and budgets, a durable ledger of every request, and spend reports.

One :class:`Accountant` per gateway process, owned by the app (no module state)::

    accountant = Accountant("var/ledger.sqlite3")                          # embedded: this process only
    accountant = Accountant(path, redis=make_client(url), key_prefix=p)   # shared by every process
    await accountant.start()     # open the file, reload this month's totals, replay the outbox to Redis
    ...
    await accountant.stop()      # finish pending settles, replay what can be, commit; then close the client

Per request (one reservation, then exactly one of settle / release)::

    try:
        reservation = await accountant.reserve(tenant, limits, tokens=prompt + max_tokens,
                                               worst_case_usd=worst, hosted=any_hosted_candidate)
    except QuotaExceeded as refused:   # .limit, .message, .retry_after_s (None: waiting cannot help)
        ...                            # 429 with Retry-After: refused.retry_after_header
    # it reached a backend (any outcome): the real cost replaces the hold
    accountant.settle_soon(reservation, LedgerEntry(request_id=..., time=time.time(), tenant=..., route=...,
                           backend=..., kind="replica" | "hosted", prompt_tokens=..., cached_tokens=...,
                           completion_tokens=..., cost_usd=..., hosted_equivalent_usd=..., outcome=...))
    # it never reached one: everything comes back (an error entry at cost 0 may be booked with it)
    accountant.release_soon(reservation)

``settle`` / ``release`` are the awaitable forms. Reads: ``spend(tenant, limits)`` -> :class:`TenantSpend`
(today and this month: total, hosted, hosted equivalent and savings, by kind and by backend, held; rate
usage), ``spend_all(limits_by_tenant)``, ``series(tenant, hours=, bucket_s=)`` -> dense
:class:`SeriesPoint` per bucket and kind. ``degraded`` is true while Redis is away or behind.

Guarantees: check-and-reserve is atomic (one Lua script in Redis; no await in-process), so concurrent
reservations never admit past a budget. Entries are in the SQLite file once :meth:`Accountant.flush` or
:meth:`Accountant.stop` return (the background writer commits within a batch otherwise), and reach Redis
exactly once (idempotent ids), after an outage too; settles reach it in batches a few milliseconds apart,
each hold dropped in the same atomic step that counts its entry (this process's reads send what waits
first). While Redis is away, ``fail_open=True`` admits within this process's share of what was left when it
last saw the shared totals; ``fail_open=False`` refuses tenants with a budget. A Redis that comes back empty
is refused by every budget write (each carries its process's epoch) until the process has put back its
ledger, outbox and open holds (:mod:`.rebuild`).

Modules: :mod:`.limits` (limits, refusals, UTC windows), :mod:`.gcra` (rate limits), :mod:`.quota`
(interface, in-process), :mod:`.quota_redis` + :mod:`.scripts` + :mod:`.redis_keys` (Redis),
:mod:`.batches` (settles sent to Redis together), :mod:`.ledger` (file), :mod:`.shipper` (outbox replay),
:mod:`.rollup` + :mod:`.spend_redis` + :mod:`.report` (reads).
"""

from .accountant import Accountant
from .limits import UNLIMITED, QuotaExceeded, TenantLimits
from .quota import LocalQuota, Quota
from .quota_redis import RedisQuota, make_client
from .records import LedgerEntry, Reservation
from .report import RateUsage, SeriesPoint, TenantSpend, Totals, WindowSpend

__all__ = [
    "UNLIMITED",
    "Accountant",
    "LedgerEntry",
    "LocalQuota",
    "Quota",
    "QuotaExceeded",
    "RateUsage",
    "RedisQuota",
    "Reservation",
    "SeriesPoint",
    "TenantLimits",
    "TenantSpend",
    "Totals",
    "WindowSpend",
    "make_client",
]
