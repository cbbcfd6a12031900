"""Stored responses of a gateway without Redis: a SQLite file in the data directory (``responses.sqlite3``), so a
restart keeps every response a client may still chain to or retrieve, as it keeps the ledger and the managed keys.

One row per response, keyed by (tenant, id), so one tenant never reads another's. Expiry is wall-clock time (it
must hold across restarts); a tenant's oldest rows past the bound go as each new one is stored, and every tenant's
expired rows with them. SQLite runs in a worker thread, never on the event loop; a file that cannot be opened or
written is :class:`StoreUnavailable` (a chained request is answered 503, an answer still goes out unstored).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from spillgate.gateway.faces.response_store import StoredResponse, StoreUnavailable
from spillgate.gateway.sqlite_files import open_shared, write_transaction

FILE_NAME = "responses.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    tenant TEXT NOT NULL,
    id TEXT NOT NULL,
    stored_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    record BLOB NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX IF NOT EXISTS responses_by_age ON responses (tenant, stored_at);
CREATE INDEX IF NOT EXISTS responses_by_expiry ON responses (expires_at);
"""


class FileStore:
    """The store of a gateway without Redis, in ``data_dir``; opened on first use."""

    def __init__(self, data_dir: Path, clock: Any = time.time) -> None:
        self._path = data_dir / FILE_NAME
        self._clock = clock
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        return await self._run(self._get, tenant, response_id)

    async def put(self, tenant: str, record: StoredResponse, *, ttl_s: float, limit: int) -> None:
        if limit <= 0:
            return
        await self._run(self._put, tenant, record, ttl_s, limit)

    async def delete(self, tenant: str, response_id: str) -> bool:
        return await self._run(self._delete, tenant, response_id)

    async def _run(self, call: Any, *args: Any) -> Any:
        try:
            return await asyncio.to_thread(self._locked, call, *args)
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(f"{self._path}: {exc}") from None

    def _locked(self, call: Any, *args: Any) -> Any:
        with self._lock:
            return call(self._open(), *args)

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            # Conversations are the tenants' own words: readable by the gateway's user only (SQLite gives its
            # journal files the database file's mode).
            os.close(os.open(self._path, os.O_WRONLY | os.O_CREAT, 0o600))
            db = open_shared(self._path, synchronous="NORMAL")  # a killed process loses nothing committed
            try:
                db.executescript(_SCHEMA)
            except BaseException:
                db.close()
                raise
            self._db = db
        return self._db

    def _get(self, db: sqlite3.Connection, tenant: str, response_id: str) -> StoredResponse | None:
        row = db.execute(
            "SELECT record FROM responses WHERE tenant = ? AND id = ? AND expires_at > ?",
            (tenant, response_id, self._clock()),
        ).fetchone()
        return StoredResponse.loads(row[0]) if row is not None else None

    def _put(self, db: sqlite3.Connection, tenant: str, record: StoredResponse, ttl_s: float, limit: int) -> None:
        now = self._clock()
        with write_transaction(db):
            db.execute(
                "INSERT OR REPLACE INTO responses (tenant, id, stored_at, expires_at, record) VALUES (?, ?, ?, ?, ?)",
                (tenant, record.response["id"], now, now + ttl_s, record.dumps()),
            )
            db.execute("DELETE FROM responses WHERE expires_at <= ?", (now,))
            (count,) = db.execute("SELECT COUNT(*) FROM responses WHERE tenant = ?", (tenant,)).fetchone()
            if count > limit:
                db.execute(
                    "DELETE FROM responses WHERE rowid IN "
                    "(SELECT rowid FROM responses WHERE tenant = ? ORDER BY stored_at, rowid LIMIT ?)",
                    (tenant, count - limit),
                )

    def _delete(self, db: sqlite3.Connection, tenant: str, response_id: str) -> bool:
        cursor = db.execute(
            "DELETE FROM responses WHERE tenant = ? AND id = ? AND expires_at > ?", (tenant, response_id, self._clock())
        )
        return cursor.rowcount > 0
