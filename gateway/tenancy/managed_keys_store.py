"""Where managed keys are kept: a JSON file in the data directory (written whole, atomically, mode 0600), and
with Redis a hash shared by every process, an epoch that counts its changes and a channel announcing each.

Redis layout (``<prefix>`` is ``state.key_prefix``)::

    <prefix>:keys:records   hash: key id -> its record (JSON, the digest included; never the key)
    <prefix>:keys:epoch     number of changes made: a process that sees another number than its own reloads
    <prefix>:keys:changes   channel: {"epoch", "records"} for each change
    <prefix>:keys:ack:<n>   how many processes applied change n (the writer waits for all of them)
    <prefix>:keys:used      hash: key id -> when it was last used (approximate, flushed every few seconds)
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from spillgate.gateway.tenancy.managed_keys import ManagedKey

FILE_NAME = "managed-keys.json"

_WRITE = """
local mode = ARGV[1]
for i = 2, #ARGV, 3 do
  local current = redis.call('HGET', KEYS[1], ARGV[i]) or ''
  if mode == 'cas' and current ~= ARGV[i + 1] then
    return -1
  end
end
for i = 2, #ARGV, 3 do
  if mode == 'cas' or redis.call('HEXISTS', KEYS[1], ARGV[i]) == 0 then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
  end
end
return redis.call('INCR', KEYS[2])
"""
"""Write records in one step and count the change. ``cas``: each record's stored JSON must still be the one the
change was made from ('' for a new one), else nothing is written (-1). ``seed``: only records Redis lacks."""

_LAST_USED = """
for i = 1, #ARGV, 2 do
  local current = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if tonumber(ARGV[i + 1]) > current then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return 0
"""


def encode(record: ManagedKey) -> str:
    return json.dumps(record.to_json(), sort_keys=True, separators=(",", ":"))


def decode(text: str | bytes) -> ManagedKey:
    return ManagedKey.from_json(json.loads(text))


# The file ---------------------------------------------------------------------------------------------


def read_file(data_dir: Path) -> tuple[list[ManagedKey], dict[str, float]]:
    """The records and last-use times kept in the data directory; none when there is no file yet."""
    path = data_dir / FILE_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return [], {}
    records = [ManagedKey.from_json(r) for r in data.get("keys", [])]
    return records, {str(k): float(v) for k, v in data.get("last_used", {}).items()}


def write_file(data_dir: Path, records: list[ManagedKey], last_used: dict[str, float]) -> None:
    """Replace the file whole: written to a private temporary file (0600), flushed, then renamed over the old one,
    so a crash leaves the old file or the new one, never half of one. Processes sharing the directory each use
    their own temporary name."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / FILE_NAME
    temporary = data_dir / f".{FILE_NAME}.{os.getpid()}.{secrets.token_hex(4)}"
    body = {"keys": [r.to_json() for r in sorted(records, key=lambda r: r.created_at)], "last_used": last_used}
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(body, out, indent=1, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise


# Redis ------------------------------------------------------------------------------------------------


class RedisKeyStore:
    """The shared records; every call may raise one of ``OUTAGE_ERRORS`` (the caller decides what that means)."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.client = client
        self.records_key = f"{prefix}:keys:records"
        self.epoch_key = f"{prefix}:keys:epoch"
        self.channel = f"{prefix}:keys:changes"
        self.used_key = f"{prefix}:keys:used"
        self._ack_prefix = f"{prefix}:keys:ack:"
        self._write = client.register_script(_WRITE)
        self._last_used = client.register_script(_LAST_USED)

    async def load(self) -> tuple[int, list[ManagedKey]]:
        """Every record and the epoch they are at, read together."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.get(self.epoch_key)
            pipe.hgetall(self.records_key)
            epoch, found = await pipe.execute()
        return int(epoch or 0), [decode(v) for v in found.values()]

    async def epoch(self) -> int:
        return int(await self.client.get(self.epoch_key) or 0)

    async def has_epoch(self) -> bool:
        return bool(await self.client.exists(self.epoch_key))

    async def write(self, changes: list[tuple[ManagedKey, ManagedKey | None]]) -> int:
        """Store each ``(new, old)`` if its stored record is still ``old`` (None: none yet); the new epoch, or -1
        when another process changed one of them first."""
        args: list[str] = ["cas"]
        for new, old in changes:
            args += [new.id, "" if old is None else encode(old), encode(new)]
        return int(await self._write(keys=[self.records_key, self.epoch_key], args=args))

    async def seed(self, records: list[ManagedKey]) -> int:
        """Put back records an emptied Redis lost (those it has are left alone)."""
        args: list[str] = ["seed"]
        for record in records:
            args += [record.id, "", encode(record)]
        return int(await self._write(keys=[self.records_key, self.epoch_key], args=args))

    async def announce(self, epoch: int, records: list[ManagedKey]) -> int:
        """Tell every process of a change; how many listeners heard it."""
        message = json.dumps({"epoch": epoch, "records": [r.to_json() for r in records]})
        return int(await self.client.publish(self.channel, message))

    async def acknowledge(self, epoch: int) -> None:
        key = f"{self._ack_prefix}{epoch}"
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.incr(key)
            pipe.expire(key, 60)
            await pipe.execute()

    async def acknowledged(self, epoch: int) -> int:
        return int(await self.client.get(f"{self._ack_prefix}{epoch}") or 0)

    async def record_use(self, used: dict[str, float]) -> None:
        args: list[Any] = []
        for key_id, at in used.items():
            args += [key_id, f"{at:.3f}"]
        if args:
            await self._last_used(keys=[self.used_key], args=args)

    async def last_used(self) -> dict[str, float]:
        found = await self.client.hgetall(self.used_key)
        return {_text(k): float(v) for k, v in found.items()}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def decode_change(data: str | bytes) -> tuple[int, list[ManagedKey]]:
    """A message from the changes channel."""
    message = json.loads(data)
    return int(message["epoch"]), [ManagedKey.from_json(r) for r in message["records"]]
