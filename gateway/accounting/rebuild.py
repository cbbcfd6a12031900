"""Coming back to the shared budgets: after an outage, and when Redis came back empty (a restart without
persistence, a failover to an empty replica).

Budgets compare Redis's rollups plus the holds of requests in flight; an empty Redis would admit every tenant
afresh. The loss is told by an epoch key that the first process sets when the rollups start, and every
write is fenced with the epoch its process joined (:mod:`.scripts`), so a process cannot reserve or settle
in an empty Redis before it knows: its first call there fails, and it falls back to its share of what was
left, as during an outage. Its shipper then rejoins, in this order:

1. :meth:`Epochs.enter`: the current epoch (starting one if Redis has none). If it is not the one this
   ledger last added to, Redis lost the rollups: this ledger's counted entries are added back, once per
   ledger and epoch (a marker). A ledger that never saw an epoch adds nothing: Redis may have its entries.
2. The outbox: entries booked while away, replayed once each (:mod:`.shipper`).
3. :meth:`Epochs.rejoin`: requests under a budget start to wait; the holds of the requests in flight here
   go back (those reserved in the old Redis, and those reserved here meanwhile); this process joins the
   epoch's roll. It shares again once the roll holds every process it last saw (each has put back what it
   knew), or after ``wait_for_peers_s`` (a peer that died with Redis never joins).

Every process's ledger holds the entries it booked and every process holds its own requests in flight, so
together they put back everything: no process admits against the new Redis before the others' spend and
holds are in it, and until then each spends only its share. Requests that settle meanwhile are booked
locally and replayed; their holds, put back or not, are dropped with them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import defaultdict
from pathlib import Path

from .ledger import GroupRow, Ledger
from .limits import day_start, month_start, to_nano
from .quota_redis import RedisQuota
from .records import new_id
from .scripts import REBUILD

log = logging.getLogger("spillgate.accounting")

_MARKER_TTL_S = 40 * 86_400


class Epochs:
    """One process's way back to the shared budgets (see the module)."""

    def __init__(self, quota: RedisQuota, ledger: Ledger, state_path: Path, *, wait_for_peers_s: float = 10.0) -> None:
        self._quota = quota
        self._ledger = ledger
        self._path = state_path
        self._rebuild = quota.client.register_script(REBUILD)
        state = self._read()
        self._ledger_id: str = state.get("ledger") or new_id()
        self._last: str | None = state.get("epoch")
        """The epoch this ledger's counted entries were last added to (kept next to the ledger)."""
        self._process_id = new_id()
        self._wait_for_peers_s = wait_for_peers_s
        self._waiting_since: float | None = None

    async def current(self) -> str:
        """The epoch of the shared rollups; a Redis without one (it came back empty) starts a new one."""
        client, key = self._quota.client, self._quota.keys.epoch
        current = await client.get(key)
        if current is None:
            await client.set(key, new_id(), nx=True)
            current = await client.get(key)
        return _text(current)

    async def lost(self) -> bool:
        """Whether Redis lost the rollups this process shares (a periodic look by an idle process: a busy one
        learns it from its first fenced call)."""
        return await self.current() != self._quota.epoch

    async def enter(self, now: float) -> None:
        """Fence this process's writes with the current epoch, after adding back this ledger's counted
        entries if Redis lost them."""
        epoch = await self.current()
        if epoch != self._last:
            if self._last is not None:
                await self._ledger.flush()  # entries counted in the old Redis may still be queued
                await self._add_back(epoch, now)
            self._remember(epoch)
        self._quota.epoch = epoch

    async def rejoin(self, now: float) -> bool:
        """Put back the holds of the requests in flight here and join the epoch's roll (after :meth:`enter`
        and the outbox); True once this process shares the budgets again."""
        quota, client = self._quota, self._quota.client
        quota.rejoin()
        await quota.put_back_holds(now)
        roll = quota.keys.joined(quota.epoch)
        async with client.pipeline(transaction=False) as pipe:
            pipe.sadd(roll, self._process_id)
            pipe.scard(roll)
            _, joined = await pipe.execute()
        expected = quota.expected_processes()
        if joined < expected:
            started = self._waiting_since = self._waiting_since or time.monotonic()
            if time.monotonic() - started < self._wait_for_peers_s:
                return False
            log.warning("%d of %d gateway processes put their spend back: sharing the budgets anyway", joined, expected)
        self._waiting_since = None
        quota.restored()
        return True

    async def _add_back(self, epoch: str, now: float) -> None:
        since = min(month_start(now), day_start(now) - 86_400)
        groups: dict[tuple[str, str], list[GroupRow]] = defaultdict(list)
        for row in await self._ledger.groups(since, shipped_only=True):
            groups[(row[0], row[1][:6])].append(row)
        day_ttl, month_ttl = self._quota.ttls[0], self._quota.ttls[1]
        keys = self._quota.keys
        for (tenant, month), rows in groups.items():
            days = sorted({row[1] for row in rows})
            script_keys = [
                keys.rebuilt(tenant, epoch, f"{self._ledger_id}:{month}"),
                keys.month(tenant, month),
                *(keys.day(tenant, day) for day in days),
            ]
            args: list[str | int] = [_MARKER_TTL_S, month_ttl, day_ttl]
            for _, day, kind, backend, n, prompt, cached, completion, usd, equiv in rows:
                args += [3 + days.index(day), kind, backend, n, prompt or 0, cached or 0, completion or 0]
                args += [to_nano(usd or 0.0), to_nano(equiv or 0.0)]
            await self._rebuild(keys=script_keys, args=args)
        if groups:
            await self._quota.client.sadd(keys.tenants, *{tenant for tenant, _ in groups})
        log.warning("Redis came back without its rollups: added this process's %d ledger groups back", len(groups))

    def _read(self) -> dict[str, str]:
        try:
            data = json.loads(self._path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _remember(self, epoch: str) -> None:
        self._last = epoch
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"ledger": self._ledger_id, "epoch": epoch}))
        os.replace(tmp, self._path)


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value
