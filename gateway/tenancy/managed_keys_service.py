"""This process's copy of the managed keys, kept current, and the changes the admin API makes to them.

Without Redis the keys live in this process and the data directory's file. With Redis every process holds the
whole set in memory (a request's lookup is one dict lookup, no round trip) and a change reaches all of them
before the admin call that made it returns:

- the change is written to Redis with the next epoch, then announced on a channel;
- each process applies the announcement and counts itself on the change's acknowledgement counter;
- the writer answers once as many processes acknowledged as heard the announcement (at most a second).

A process that misses an announcement (its subscription broke) sees the epoch move within half a second and
reloads, so no revoked key keeps working longer than that anywhere. While Redis is unreachable, ``fail_open``
keeps the last known set working (expiry still applies); ``fail_closed`` refuses every managed key after two
seconds without word from Redis, since a revocation may have been missed. Keys from the config file are not
affected either way."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from spillgate.gateway.accounting.quota_redis import OUTAGE_ERRORS
from spillgate.gateway.tenancy.managed_keys import KeyLimits, KeyStoreUnavailable, ManagedKey, make_key
from spillgate.gateway.tenancy.managed_keys_store import (
    RedisKeyStore,
    decode_change,
    read_file,
    write_file,
)

log = logging.getLogger("spillgate.keys")

_CHECK_S = 0.5
"""How often each process compares its epoch with Redis's: the longest a missed announcement can matter."""
_STALE_S = 2.0
"""Without word from Redis this long, a ``fail_closed`` gateway refuses managed keys."""
_ACK_WAIT_S = 1.0
_USED_FLUSH_S = 5.0
_RETRIES = 5

Change = list[tuple[ManagedKey, ManagedKey | None]]


class UnknownKey(Exception):
    pass


class ManagedKeys:
    """Owned by the keys API: ``await start()``, look keys up per request, change them, ``await stop()``."""

    def __init__(self, data_dir: Path, *, redis_url: str | None, key_prefix: str, fail_open: bool) -> None:
        self._data_dir = data_dir
        self._redis_url = redis_url
        self._prefix = key_prefix
        self.fail_open = fail_open
        self._by_digest: dict[str, ManagedKey] = {}
        self._by_id: dict[str, ManagedKey] = {}
        self._used: dict[str, float] = {}
        self._unflushed: dict[str, float] = {}
        self._epoch = 0
        self._synced_at = 0.0
        self._store: RedisKeyStore | None = None
        self._clients: list[aioredis.Redis] = []
        self._following: asyncio.Task[None] | None = None
        self._mirroring: asyncio.Task[None] | None = None
        self._unmirrored = False
        self._lock = asyncio.Lock()
        self._loaded = asyncio.Event()

    @property
    def shared(self) -> bool:
        return self._redis_url is not None

    # The hot path ---------------------------------------------------------------------------------------

    def find(self, digest: str, now: float) -> ManagedKey | None:
        """The usable key with this digest, or None; raises :class:`KeyStoreUnavailable` for a managed key while a
        ``fail_closed`` gateway has lost Redis."""
        record = self._by_digest.get(digest)
        if record is None:
            return None
        if self.refusing:
            raise KeyStoreUnavailable
        if not record.usable(now):
            return None
        if self._used.get(record.id, 0.0) < now - 1.0:  # a second's precision is plenty, and spares the writes
            self._used[record.id] = self._unflushed[record.id] = now
        return record

    def knows(self, digest: str) -> bool:
        """A managed key's digest, usable or not."""
        return digest in self._by_digest

    @property
    def refusing(self) -> bool:
        return self.shared and not self.fail_open and time.monotonic() - self._synced_at > _STALE_S

    # Reads ----------------------------------------------------------------------------------------------

    def records(self) -> list[ManagedKey]:
        return sorted(self._by_id.values(), key=lambda r: (r.created_at, r.id))

    def get(self, key_id: str) -> ManagedKey | None:
        return self._by_id.get(key_id)

    async def last_used(self) -> dict[str, float]:
        """When each key was last used, by any process as far as it has told Redis, else by this one."""
        used = dict(self._used)
        if self._store is not None:
            with contextlib.suppress(*OUTAGE_ERRORS):
                for key_id, at in (await self._store.last_used()).items():
                    used[key_id] = max(at, used.get(key_id, 0.0))
        return used

    # Changes --------------------------------------------------------------------------------------------

    async def create(
        self, tenant: str, now: float, *, name: str | None, expires_at: float | None, limits: KeyLimits
    ) -> tuple[str, ManagedKey]:
        secret, record = make_key(tenant, now, name=name, expires_at=expires_at, limits=limits)
        await self._commit(lambda: [(record, None)])
        return secret, record

    async def rotate(self, key_id: str, now: float, grace_s: float) -> tuple[str, ManagedKey, ManagedKey]:
        """A new key with the old one's tenant and settings; the old one stops working after ``grace_s``."""
        made: list[tuple[str, ManagedKey, ManagedKey]] = []

        def change() -> Change:
            old = self._usable_or_raise(key_id, now)
            secret, new = make_key(
                old.tenant, now, name=old.name, expires_at=old.expires_at, limits=old.limits, rotated_from=old.id
            )
            made[:] = [(secret, new, old.revoked(now + grace_s, replaced_by=new.id))]
            return [(new, None), (made[0][2], old)]

        await self._commit(change)
        return made[0]

    async def revoke(self, key_id: str, now: float) -> ManagedKey:
        revoked: list[ManagedKey] = []

        def change() -> Change:
            old = self._by_id.get(key_id)
            if old is None:
                raise UnknownKey(key_id)
            revoked[:] = [old.revoked(now)]
            return [] if revoked[0] == old else [(revoked[0], old)]

        await self._commit(change)
        return revoked[0]

    def _usable_or_raise(self, key_id: str, now: float) -> ManagedKey:
        old = self._by_id.get(key_id)
        if old is None:
            raise UnknownKey(key_id)
        if not old.usable(now):
            raise ValueError(f"Key {key_id} is revoked or expired: it cannot be rotated.")
        return old

    async def _commit(self, change: Callable[[], Change]) -> None:
        if self._store is None:
            async with self._lock:
                records = change()
                self._apply([new for new, _ in records])
                await asyncio.to_thread(write_file, self._data_dir, self.records(), dict(self._used))
            return
        try:
            for _ in range(_RETRIES):
                records = change()
                if not records:
                    return
                epoch = await self._store.write(records)
                if epoch >= 0:
                    break
                await self._reload()  # another process changed one of these records first
            else:
                raise KeyStoreUnavailable
            written = [new for new, _ in records]
            await self._heard(epoch, written)
            listeners = await self._store.announce(epoch, written)
            await self._wait_for(epoch, listeners)
        except OUTAGE_ERRORS as exc:
            raise KeyStoreUnavailable from exc

    async def _wait_for(self, epoch: int, listeners: int) -> None:
        """Until every process that heard the change has applied it (a process that did not hear it reloads at
        its next epoch check)."""
        assert self._store is not None
        deadline = time.monotonic() + _ACK_WAIT_S
        while await self._store.acknowledged(epoch) < listeners and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    # Life cycle -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        records, used = await asyncio.to_thread(read_file, self._data_dir)
        self._apply(records)
        self._used.update(used)
        if self._redis_url is None:
            return
        # One retry on a broken connection: after Redis restarts every pooled connection is dead.
        retry = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
        client = aioredis.from_url(self._redis_url, socket_timeout=2.0, socket_connect_timeout=1.0, retry=retry)
        listener = aioredis.from_url(self._redis_url, socket_timeout=5.0, socket_connect_timeout=1.0)
        self._clients = [client, listener]
        self._store = RedisKeyStore(client, self._prefix)
        self._following = asyncio.create_task(self._follow(listener, records))
        with contextlib.suppress(TimeoutError):  # Redis away: start on the file's copy, and keep trying
            await asyncio.wait_for(self._loaded.wait(), 3.0)

    async def stop(self) -> None:
        if self._following is not None:
            self._following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._following
        if self._mirroring is not None:
            await self._mirroring
        if self._store is not None:
            with contextlib.suppress(*OUTAGE_ERRORS):
                await self._store.record_use(self._unflushed)
            await asyncio.to_thread(write_file, self._data_dir, self.records(), dict(self._used))
        elif self._unflushed:
            await asyncio.to_thread(write_file, self._data_dir, self.records(), dict(self._used))
        for client in self._clients:
            await client.aclose()

    async def _follow(self, listener: aioredis.Redis, mirrored: list[ManagedKey]) -> None:
        """Hear each change, check the epoch every half second, and after any outage start over: subscribe first,
        then reload, so nothing changed in between is missed."""
        assert self._store is not None
        while True:
            try:
                async with listener.pubsub() as pubsub:
                    await pubsub.subscribe(self._store.channel)
                    if not await self._store.has_epoch():  # a new or emptied Redis: give it what is known
                        await self._store.seed(self.records() or mirrored)
                    await self._reload()
                    self._loaded.set()
                    await self._listen(pubsub)
            except asyncio.CancelledError:
                raise
            except OUTAGE_ERRORS as exc:
                if time.monotonic() - self._synced_at < _STALE_S + 1.0:
                    log.warning("managed keys: Redis unreachable (%s); %s", exc, self._outage_rule())
                await asyncio.sleep(_CHECK_S)

    async def _listen(self, pubsub: aioredis.client.PubSub) -> None:
        assert self._store is not None
        next_check = time.monotonic() + _CHECK_S
        next_flush = time.monotonic() + _USED_FLUSH_S
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=_CHECK_S / 2)
            if message is not None and message.get("type") == "message":
                epoch, records = decode_change(message["data"])
                await self._heard(epoch, records)
                await self._store.acknowledge(epoch)
            now = time.monotonic()
            if now >= next_check:
                next_check = now + _CHECK_S
                if not await self._store.has_epoch():
                    raise ConnectionError("Redis lost the managed keys")  # start over: seed it again
                if await self._store.epoch() != self._epoch:
                    await self._reload()
                self._synced_at = time.monotonic()
            if now >= next_flush and self._unflushed:
                next_flush = now + _USED_FLUSH_S
                used, self._unflushed = self._unflushed, {}
                await self._store.record_use(used)

    async def _heard(self, epoch: int, records: list[ManagedKey]) -> None:
        async with self._lock:
            self._apply(records)
            if epoch == self._epoch + 1:
                self._epoch = epoch
                self._synced_at = time.monotonic()
                self._mirror_soon()
                return
        if epoch > self._epoch:
            await self._reload()  # one was missed

    async def _reload(self) -> None:
        assert self._store is not None
        async with self._lock:
            epoch, records = await self._store.load()
            self._by_id, self._by_digest = {}, {}
            self._apply(records)
            self._epoch = epoch
            self._synced_at = time.monotonic()
        self._mirror_soon()

    def _mirror_soon(self) -> None:
        """Copy the set into the data directory after this change is acknowledged: should Redis come back empty
        (the private one of ``serve --workers`` ends with the gateway), the copy brings the keys back."""
        self._unmirrored = True
        if self._mirroring is None or self._mirroring.done():
            self._mirroring = asyncio.create_task(self._mirror())

    async def _mirror(self) -> None:
        await asyncio.sleep(0)  # after the acknowledgement
        while self._unmirrored:
            self._unmirrored = False
            try:
                await asyncio.to_thread(write_file, self._data_dir, self.records(), dict(self._used))
            except OSError as exc:
                log.error("managed keys: cannot write their copy in %s: %s", self._data_dir, exc)

    def _apply(self, records: list[ManagedKey]) -> None:
        for record in records:
            self._by_id[record.id] = record
            self._by_digest[record.digest] = record

    def _outage_rule(self) -> str:
        if self.fail_open:
            return "managed keys known so far keep working (fail_open)"
        return "managed keys are refused until it is back (fail_closed)"
