"""Putting the shared rollups back when Redis comes back empty (a restart without persistence, a failover to
an empty replica).

Budgets compare Redis's rollups, and empty ones would admit every tenant afresh. Each gateway process's ledger
holds the entries it booked, so together they hold them all: each process adds its own shipped entries' totals
(per day, kind and backend, from the start of the month) back once per epoch, made idempotent by a marker per
ledger and epoch; its unshipped entries reach Redis through the outbox as always. Entries recorded in the empty
Redis before the loss was noticed (one check interval) are counted twice: spend errs high, never low.

The loss is told by an epoch key that the first process sets when the rollups start. Each process keeps the
epoch it last saw next to its ledger: a different or missing one means the rollups it added to are gone. A
ledger that never saw an epoch (its first run, or its first with this code) adds nothing, since Redis may
already hold its entries.
"""

from __future__ import annotations

import json
import logging
import os
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
    """Watches the shared rollups' epoch for one process and rebuilds them from its ledger when it changes."""

    def __init__(self, quota: RedisQuota, ledger: Ledger, state_path: Path) -> None:
        self._quota = quota
        self._ledger = ledger
        self._path = state_path
        self._rebuild = quota.client.register_script(REBUILD)
        state = self._read()
        self._ledger_id: str = state.get("ledger") or new_id()
        self._last: str | None = state.get("epoch")

    async def check(self, now: float) -> bool:
        """One look at the epoch (a Redis call or two); True when this process's totals were added back."""
        client, keys = self._quota.client, self._quota.keys
        current = await client.get(keys.epoch)
        if current is None:
            await client.set(keys.epoch, new_id(), nx=True)
            current = await client.get(keys.epoch)
        epoch = _text(current)
        if epoch == self._last:
            return False
        rebuilt = self._last is not None and await self._add_back(epoch, now)
        self._remember(epoch)
        return rebuilt

    async def _add_back(self, epoch: str, now: float) -> bool:
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
        return True

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
