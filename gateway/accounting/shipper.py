"""Gets the ledger's outbox into Redis: entries booked while Redis was away, replayed exactly once.

It probes Redis while the quota believes it down, and on an answer replays every unshipped entry (the
Lua record script skips ids Redis has already counted) before telling the quota Redis is back, so shared
budgets include the outage's spend by the time they are enforced again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from gateway.tasks import stop_if_cancelled

from .ledger import Ledger
from .quota_redis import OUTAGE_ERRORS, RedisQuota
from .rebuild import Epochs

log = logging.getLogger("spillgate.accounting")


class Shipper:
    def __init__(
        self,
        quota: RedisQuota,
        ledger: Ledger,
        *,
        interval_s: float = 0.5,
        batch: int = 500,
        epochs: Epochs | None = None,
        epoch_interval_s: float = 2.0,
    ) -> None:
        self.quota = quota
        self.ledger = ledger
        self.interval_s = interval_s
        self.batch = batch
        self.epochs = epochs
        """Tells when Redis came back without its rollups, and adds this process's back (:mod:`.rebuild`)."""
        self.epoch_interval_s = epoch_interval_s
        self._epoch_checked = -float("inf")
        self._holds_renewed = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    @property
    def idle(self) -> bool:
        return not self.quota.down and self.ledger.backlog == 0 and not self.quota.pending_releases

    async def start(self) -> None:
        await self.run_once()
        self._task = asyncio.create_task(self._run_forever(), name="spillgate-ledger-shipper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.run_once()  # a last try; what does not make it stays in the file for the next start

    async def run_once(self) -> bool:
        """One pass; True when Redis has every entry and the quota is shared again."""
        if self.idle:
            return await self._check_epoch()
        if self.quota.down and not await self.quota.probe():
            return False
        try:
            await self._check_epoch(force=True)
            await self.ledger.flush()
            while rows := await self.ledger.unshipped(self.batch):
                await self.quota.replay(rows, time.time())
                await self.ledger.mark_shipped([entry.entry_id for entry, _ in rows])
                log.info("replayed %d ledger entries to Redis", len(rows))
            await self.quota.replay_releases(time.time())
        except OUTAGE_ERRORS as exc:
            self.quota.lost(exc)
            return False
        self.quota.restored()
        return True

    async def _renew_holds(self) -> None:
        """A third of the way to their lapse, renew the holds of the requests still in progress."""
        now = time.monotonic()
        if now - self._holds_renewed < self.quota.hold_ttl_s / 3:
            return
        self._holds_renewed = now
        try:
            await self.quota.renew_holds(time.time())
        except OUTAGE_ERRORS as exc:
            self.quota.lost(exc)

    async def _check_epoch(self, *, force: bool = False) -> bool:
        """Every ``epoch_interval_s`` (or now, coming out of an outage): did Redis lose the rollups?"""
        now = time.monotonic()
        if self.epochs is None or (not force and now - self._epoch_checked < self.epoch_interval_s):
            return True
        self._epoch_checked = now
        try:
            await self.epochs.check(time.time())
        except OUTAGE_ERRORS as exc:
            if force:
                raise
            self.quota.lost(exc)
            return False
        return True

    async def _run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.run_once()
                await self._renew_holds()
            except Exception:  # the file may be failing; never let the shipper die
                log.exception("ledger shipper pass failed")
            stop_if_cancelled()  # run_once may have caught a cancel that redis-py turned into an outage error
