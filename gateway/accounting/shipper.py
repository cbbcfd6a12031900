"""Gets the ledger's outbox into Redis, and this process back to sharing the budgets there.

It probes Redis while the quota does not share it, and on an answer rejoins (:mod:`.rebuild`): adds this
ledger's counted entries back if Redis lost them, replays every unshipped entry (the Lua record script skips
ids Redis has already counted), puts back the holds of the requests still in flight, and only then lets the
quota share again, so shared budgets include everything this process knows by the time they are enforced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from spillgate.gateway.tasks import stop_if_cancelled

from .ledger import Ledger
from .quota_redis import OUTAGE_ERRORS, RedisQuota
from .rebuild import Epochs

log = logging.getLogger("spillgate.accounting")

_REJOIN_POLL_S = 0.05
"""How often a process waiting for the others to put their spend back looks again: its budgeted requests wait."""


class Shipper:
    def __init__(
        self,
        quota: RedisQuota,
        ledger: Ledger,
        epochs: Epochs,
        *,
        interval_s: float = 0.5,
        batch: int = 500,
        epoch_interval_s: float = 2.0,
    ) -> None:
        self.quota = quota
        self.ledger = ledger
        self.epochs = epochs
        self.interval_s = interval_s
        self.batch = batch
        self.epoch_interval_s = epoch_interval_s
        """How often an idle process looks whether Redis lost the rollups (a busy one learns it at once)."""
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
        """One pass; True when Redis has every entry and the quota shares it."""
        quota = self.quota
        try:
            if not quota.down and self._epoch_due() and await self.epochs.lost():
                quota.lost("STALE_EPOCH: Redis came back without the rollups")
            if self.idle:
                return True
            if quota.down and not await quota.probe():
                return False
            if quota.down:
                await self.epochs.enter(time.time())
            await self._replay()
            return not quota.down or await self.epochs.rejoin(time.time())
        except OUTAGE_ERRORS as exc:
            quota.lost(exc)
            quota.rejoin(False)
            return False

    async def _replay(self) -> None:
        await self.ledger.flush()
        while rows := await self.ledger.unshipped(self.batch):
            await self.quota.replay(rows, time.time())
            await self.ledger.mark_shipped([entry.entry_id for entry, _ in rows])
            log.info("replayed %d ledger entries to Redis", len(rows))
        await self.quota.replay_releases(time.time())

    def _epoch_due(self) -> bool:
        now = time.monotonic()
        if now - self._epoch_checked < self.epoch_interval_s:
            return False
        self._epoch_checked = now
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

    async def _run_forever(self) -> None:
        while True:
            await asyncio.sleep(_REJOIN_POLL_S if self.quota.rejoining else self.interval_s)
            try:
                await self.run_once()
                await self._renew_holds()
            except Exception:  # the file may be failing; never let the shipper die
                log.exception("ledger shipper pass failed")
                self.quota.rejoin(False)  # budgeted requests must not wait on a pass that cannot finish
            stop_if_cancelled()  # run_once may have caught a cancel that redis-py turned into an outage error
