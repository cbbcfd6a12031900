"""The two records accounting passes around: a reservation (before) and a ledger entry (after)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spillgate.policies.types import BackendKind

if TYPE_CHECKING:
    from .limits import TenantLimits


KILLED = "gateway_killed"
"""The outcome of a request its gateway process was killed while serving: booked at its worst case by the
next start (:mod:`.inflight`)."""

Dispatch = tuple[str, str, float, str, str, str, str, int, float, str, str]
"""A request sent upstream, written ahead (:mod:`.inflight`): entry id, request id, time, tenant, route,
backend, kind, prompt tokens, worst case in USD, the hold its replay to Redis drops, and the client's
``user``. A plain tuple: one is built and serialized per request, before it is sent."""
DISPATCH_FIELDS = 11
_DISPATCH_FIELDS_WITHOUT_USER = 10
"""Records written before ``user`` was kept: a killed older gateway's are still booked by a newer one."""


def new_id() -> str:
    """A random id, unique without coordination: reservation and ledger ids are never client-supplied."""
    return os.urandom(12).hex()


@dataclass(frozen=True)
class Reservation:
    """What :meth:`reserve` held for one request, until :meth:`settle` or :meth:`release` replaces it.

    The windows (``day``, ``month``) and the limits the rate charge was made under travel with it, so a
    request that crosses midnight gives back exactly what it took."""

    id: str
    tenant: str
    tokens: int
    worst_case_usd: float
    hosted: bool
    at: float
    day: str
    month: str
    requests_per_minute: int | None
    tokens_per_minute: int | None
    shared: bool
    """Held in Redis (True) or in this process's counters (False: embedded mode, or during an outage)."""

    @classmethod
    def made(
        cls,
        id: str,
        tenant: str,
        limits: TenantLimits,
        *,
        tokens: int,
        worst_case_usd: float,
        hosted: bool,
        at: float,
        day: str,
        month: str,
        shared: bool,
    ) -> Reservation:
        """A reservation under ``limits``, whose rate limits travel with it to be given back exactly."""
        return cls(
            id,
            tenant,
            tokens,
            worst_case_usd,
            hosted,
            at,
            day,
            month,
            limits.requests_per_minute,
            limits.tokens_per_minute,
            shared,
        )


@dataclass(frozen=True)
class LedgerEntry:
    """One finished request, as the durable ledger keeps it.

    ``entry_id`` is the idempotency key (the reservation's id when settled through one; leave it empty);
    ``request_id`` is the client-visible ``x-request-id`` and may repeat."""

    request_id: str
    time: float
    tenant: str
    route: str
    backend: str
    kind: BackendKind
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    hosted_equivalent_usd: float = 0.0
    outcome: str = "ok"
    entry_id: str = ""
    user: str = ""
    """OpenAI's ``user`` as the client sent it (empty when it sent none): who, behind the tenant, asked."""

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def with_id(self, entry_id: str) -> LedgerEntry:
        return self if self.entry_id else dataclasses.replace(self, entry_id=entry_id)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


ENTRY_FIELDS = tuple(f.name for f in dataclasses.fields(LedgerEntry))


def is_dispatch(record: Sequence[Any]) -> bool:
    """``record`` is a whole :data:`Dispatch` (or one written before ``user`` was kept)."""
    return len(record) in (DISPATCH_FIELDS, _DISPATCH_FIELDS_WITHOUT_USER)


def killed_entry(record: Sequence[Any]) -> tuple[LedgerEntry, str]:
    """The entry a :data:`Dispatch` left open by a killed process is booked at, and its hold."""
    entry_id, request_id, at, tenant, route, backend, kind, prompt, worst_usd, hold_id, *rest = record
    user = str(rest[0]) if rest else ""
    entry = LedgerEntry(
        request_id, at, tenant, route, backend, kind, prompt, 0, 0, worst_usd, worst_usd, KILLED, entry_id, user
    )
    return entry, hold_id
