"""The durable ledger: every finished request, in a local SQLite file, and the outbox towards Redis.

Why SQLite (WAL, ``synchronous=FULL``) rather than an fsync'd JSONL file: a batch commits atomically (no
torn last line after a crash), the outbox is a flag and a partial index instead of a second file and a
cursor, the restart totals are one ``GROUP BY`` instead of a full re-read, and old entries are pruned in
place (at start, then a chunk at a time by the writer, so a gateway that never restarts keeps a bounded
file). It is in the standard library.

Writes never block the event loop: :meth:`Ledger.append` only queues the entry's row; a background task
commits what has queued in one transaction every 100 ms (batches grow by themselves under load) on a
thread at idle CPU priority (:mod:`.idle_worker`), so the commit never takes the core from a request.
:meth:`flush` and :meth:`stop` commit everything queued before they return.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Sequence
from operator import attrgetter
from pathlib import Path
from typing import Any

from spillgate.gateway.sqlite_files import BUSY_WAIT_MS, open_shared, write_transaction

from .failures import FailureRow, read_failures
from .idle_worker import IdleWorker
from .inflight import InFlight
from .journal import Journal
from .logs import LogPage, LogQuery, read_page
from .records import ENTRY_FIELDS, Dispatch, LedgerEntry, is_dispatch, killed_entry

log = logging.getLogger("spillgate.accounting")

_TABLE = """
CREATE TABLE IF NOT EXISTS entries (
    entry_id TEXT PRIMARY KEY,
    request_id TEXT NOT NULL,
    time REAL NOT NULL,
    tenant TEXT NOT NULL,
    route TEXT NOT NULL,
    backend TEXT NOT NULL,
    kind TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cost_usd REAL NOT NULL,
    hosted_equivalent_usd REAL NOT NULL,
    outcome TEXT NOT NULL,
    hold_id TEXT NOT NULL DEFAULT '',
    shipped INTEGER NOT NULL DEFAULT 0,
    user TEXT NOT NULL DEFAULT ''
)"""
_ADDED_COLUMNS = {"user": "ALTER TABLE entries ADD COLUMN user TEXT NOT NULL DEFAULT ''"}
"""Columns a ledger file written by an older gateway lacks, added when it is opened (its rows get the default)."""
_INDEXES = """
CREATE INDEX IF NOT EXISTS entries_by_time ON entries (time);
CREATE INDEX IF NOT EXISTS entries_by_tenant ON entries (tenant, time);
CREATE INDEX IF NOT EXISTS entries_outbox ON entries (time) WHERE shipped = 0;
CREATE INDEX IF NOT EXISTS entries_failed ON entries (time, tenant) WHERE outcome != 'ok';
"""
"""By time (retention, restart totals, every tenant's logs newest first); by tenant and time (one tenant's logs,
:mod:`.logs`). SQLite keeps each row's rowid in every index, so both also order by (time, rowid). The outbox
and the failures (:mod:`.failures`) are partial indexes: only the few rows they hold."""
_COLUMNS = (*[f for f in ENTRY_FIELDS if f != "entry_id"], "entry_id")
_ROW_FIELDS = attrgetter(*_COLUMNS)
_ENTRY_ID = len(_COLUMNS) - 1
"""An entry's values in ``_COLUMNS`` order, read in C: cheap enough to run per request at append time."""
_USER = _COLUMNS.index("user")
_ROW_WITHOUT_USER = len(_COLUMNS) + 1
"""A journaled row (its columns, hold_id, shipped) written before ``user`` was kept."""
_INSERT = (
    f"INSERT OR IGNORE INTO entries ({', '.join(_COLUMNS)}, hold_id, shipped) "
    f"VALUES ({', '.join('?' * (len(_COLUMNS) + 2))})"
)
_MIGRATION_WAIT_MS = 120_000
"""Indexing a ledger of millions of rows, at the first start after an upgrade, takes a while."""
_RETRY_S = 1.0
_PRUNE_INTERVAL_S = 600.0
_PRUNE_CHUNK = 5000
"""Rows deleted per writer turn: the thread is busy for tens of milliseconds at most."""

GroupRow = tuple[str, str, str, str, int, int, int, int, float, float]
"""tenant, day (YYYYMMDD), kind, backend, requests, prompt, cached, completion, cost_usd, equivalent_usd"""
MinuteRow = tuple[str, int, str, int, float]
"""tenant, minute (epoch // 60), kind, requests, cost_usd"""
Row = tuple[object, ...]
"""An entry as inserted: its fields in ``_COLUMNS`` order, then hold_id and shipped."""


BATCH_INTERVAL_S = 0.1


class Ledger:
    def __init__(self, path: str | Path, *, retain_days: float = 62) -> None:
        self.path = Path(path)
        self.retain_s = retain_days * 86_400
        self.backlog = 0
        """Entries not yet in Redis, queued or stored (meaningful only with Redis)."""
        self._db: sqlite3.Connection | None = None
        self._db_lock = threading.Lock()
        self._queue: list[Row] = []
        self._flushing = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._writer = IdleWorker("spillgate-ledger")
        self._journal = Journal(self.path.parent, self.path.stem)
        self._inflight = InFlight(self.path.parent, self.path.stem)
        self._compacting: asyncio.Task[None] | None = None
        self.failing = False
        """The last commit failed (disk full, the file locked or read-only): entries wait in memory, nothing
        is dropped, and the gateway reports itself degraded until a commit succeeds."""
        self._newest = 0.0
        """The latest entry time appended: retention counts back from it (entries arrive in time order)."""
        self._next_prune = 0.0

    # Life cycle ------------------------------------------------------------------------------------

    async def start(self, now: float) -> None:
        await asyncio.to_thread(self._open, now)
        self._task = asyncio.create_task(self._write_forever(), name="spillgate-ledger-writer")
        self._compacting = asyncio.create_task(self._inflight.compact_forever(), name="spillgate-ledger-inflight")

    async def stop(self) -> None:
        for task in (self._task, self._compacting):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._compacting = None
        try:
            await self.flush()
            self._journal.close()
            self._inflight.close_file()
        finally:
            await asyncio.to_thread(self._writer.shutdown)
        with self._db_lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _open(self, now: float) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = open_shared(self.path, synchronous="FULL")
        _migrate(db)
        journaled = [row for row in map(_journaled_row, self._journal.recover()) if row is not None]
        unfinished = [_killed_row(record) for record in self._inflight.recover() if is_dispatch(record)]
        if journaled or unfinished:
            # A killed process's last entries (those already committed are ignored), then its requests that
            # never ended, at their worst case: one whose real entry is in the ledger by now is ignored too.
            with write_transaction(db):
                db.executemany(_INSERT, journaled)
                before = db.total_changes
                db.executemany(_INSERT, unfinished)
                killed = db.total_changes - before
            log.warning(
                "ledger %s: recovered %d journaled entries and %d requests cut off (booked at their worst case) "
                "of a process that did not stop",
                self.path,
                len(journaled),
                killed,
            )
        self._journal.recovered()
        self._inflight.recovered()
        db.execute("DELETE FROM entries WHERE time < ?", (now - self.retain_s,))
        (stored,) = db.execute("SELECT COUNT(*) FROM entries WHERE shipped = 0").fetchone()
        with self._db_lock:
            self._db = db
        self.backlog = stored + sum(1 for row in self._queue if not row[-1])

    @property
    def queued(self) -> int:
        """Entries appended and not yet committed to the file."""
        return len(self._queue)

    # Writing -----------------------------------------------------------------------------------------

    def journal(self, entry: LedgerEntry, hold_id: str = "") -> None:
        """Hand ``entry`` to the kernel at once (:mod:`.journal`), before it is settled and appended: a killed
        process's entries are recovered at the next start. A few microseconds, and never waits."""
        self._journal.write((*_ROW_FIELDS(entry), hold_id, 0), entry.entry_id)
        self._inflight.close(entry.entry_id)

    def opened(self, request: Dispatch) -> None:
        """A request is about to be sent: it is booked at its worst case should this process be killed before
        its own entry is journaled with the same id (:mod:`.inflight`). Never waits."""
        self._inflight.open(request)

    def abandoned(self, entry_id: str) -> None:
        """The request :meth:`opened` ended without an entry: nothing is booked for it."""
        self._inflight.abandon(entry_id)

    def append(self, entry: LedgerEntry, *, shipped: bool, hold_id: str = "") -> None:
        """Queue ``entry``; ``shipped`` when Redis already counted it, else ``hold_id`` is the Redis hold
        its replay must drop. Never waits.

        The row is built here, a microsecond per request, rather than for the whole batch on the writer
        thread, where it would hold the GIL while the idle-priority thread is preempted."""
        self._queue.append((*_ROW_FIELDS(entry), hold_id, int(shipped)))
        if entry.time > self._newest:
            self._newest = entry.time
        if not shipped:
            self.backlog += 1
        self._wake.set()

    async def flush(self) -> None:
        """Commit everything queued so far (fsync'd) before returning."""
        async with self._flushing:
            batch, self._queue = self._queue, []
            self._journal.rotate()
            if not batch:
                return
            try:
                await self._writer.run(self._insert, batch)
            except BaseException:
                self._queue = batch + self._queue  # INSERT OR IGNORE makes a second try harmless
                raise
            self._journal.committed(str(row[_ENTRY_ID]) for row in batch)

    async def _write_forever(self) -> None:
        while True:
            await self._wake.wait()
            # Let a batch gather: one commit (and fsync) per interval rather than per request, so the writer
            # thread wakes ten times a second, not thousands. What a hard kill can lose is bounded by this
            # interval; a clean stop flushes everything.
            await asyncio.sleep(BATCH_INTERVAL_S)
            self._wake.clear()
            try:
                await self.flush()
            except (sqlite3.Error, OSError) as exc:
                self.failing = True
                log.error("ledger %s: write failed (%s); %d entries wait, retrying", self.path, exc, self.queued)
                await asyncio.sleep(_RETRY_S)
                self._wake.set()
                continue
            self.failing = False
            if time.monotonic() >= self._next_prune and self._newest:
                await self._prune_some()

    async def _prune_some(self) -> None:
        """One chunk of the entries past retention, counted back from the newest entry (never from a time
        ahead of this machine's clock, so an entry stamped in the future cannot prune the present)."""
        try:
            pruned, unshipped = await self._writer.run(self._prune, min(self._newest, time.time()) - self.retain_s)
        except (sqlite3.Error, OSError) as exc:  # entries are safe; pruning waits for the next interval
            log.warning("ledger %s: pruning failed (%s)", self.path, exc)
            self._next_prune = time.monotonic() + _PRUNE_INTERVAL_S
            return
        self.backlog = max(0, self.backlog - unshipped)  # past retention: never to be replayed
        # A full chunk: more are old, take the next on the next turn; else look again later.
        self._next_prune = 0.0 if pruned == _PRUNE_CHUNK else time.monotonic() + _PRUNE_INTERVAL_S

    def _prune(self, before: float) -> tuple[int, int]:
        """Delete up to a chunk of the entries older than ``before``: how many went, how many of them unshipped."""
        with self._db_lock:
            db = self._connection()
            with write_transaction(db):
                old = db.execute(
                    "SELECT rowid, shipped FROM entries WHERE time < ? LIMIT ?", (before, _PRUNE_CHUNK)
                ).fetchall()
                db.executemany("DELETE FROM entries WHERE rowid = ?", [(rowid,) for rowid, _ in old])
            return len(old), sum(1 for _, shipped in old if not shipped)

    def _insert(self, rows: Sequence[Row]) -> None:
        with self._db_lock:
            db = self._connection()
            with write_transaction(db):
                db.executemany(_INSERT, rows)

    # The outbox --------------------------------------------------------------------------------------

    async def unshipped(self, limit: int) -> list[tuple[LedgerEntry, str]]:
        """The oldest entries Redis has not counted, with the hold each must drop."""
        return await asyncio.to_thread(self._unshipped, limit)

    def _unshipped(self, limit: int) -> list[tuple[LedgerEntry, str]]:
        query = f"SELECT {', '.join(_COLUMNS)}, hold_id FROM entries WHERE shipped = 0 ORDER BY time LIMIT ?"
        with self._db_lock:
            rows = self._connection().execute(query, (limit,)).fetchall()
        return [(LedgerEntry(**dict(zip(_COLUMNS, row[:-1], strict=True))), row[-1]) for row in rows]

    async def mark_shipped(self, entry_ids: Sequence[str]) -> None:
        shipped = await asyncio.to_thread(self._mark_shipped, entry_ids)
        self.backlog = max(0, self.backlog - shipped)

    def _mark_shipped(self, entry_ids: Sequence[str]) -> int:
        with self._db_lock:
            db = self._connection()
            before = db.total_changes
            with write_transaction(db):
                db.executemany(
                    "UPDATE entries SET shipped = 1, hold_id = '' WHERE entry_id = ? AND shipped = 0",
                    [(i,) for i in entry_ids],
                )
            return db.total_changes - before

    # Totals for a restart -----------------------------------------------------------------------------

    async def groups(self, since: float, *, shipped_only: bool = False) -> list[GroupRow]:
        """Sums per tenant, UTC day, kind and backend of the entries since ``since`` (``shipped_only``: of
        those Redis had counted)."""
        query = f"""
            SELECT tenant, strftime('%Y%m%d', time, 'unixepoch') AS day, kind, backend, COUNT(*),
                   SUM(prompt_tokens), SUM(cached_tokens), SUM(completion_tokens),
                   SUM(cost_usd), SUM(hosted_equivalent_usd)
            FROM entries WHERE time >= ?{" AND shipped = 1" if shipped_only else ""}
            GROUP BY tenant, day, kind, backend"""
        return await asyncio.to_thread(self._query, query, (since,))

    async def minutes(self, since: float) -> list[MinuteRow]:
        query = """
            SELECT tenant, CAST(time / 60 AS INTEGER) AS minute, kind, COUNT(*), SUM(cost_usd)
            FROM entries WHERE time >= ? GROUP BY tenant, minute, kind"""
        return await asyncio.to_thread(self._query, query, (since,))

    # Single requests -------------------------------------------------------------------------------------

    async def logs(self, query: LogQuery) -> LogPage:
        """One page of entries, newest first (:mod:`.logs`): those committed, so up to a batch interval behind.
        Raises :class:`~.logs.BadCursor` and :class:`~.logs.ReadTooSlow`."""
        self._connection()  # opened: the file exists and has every column
        return await asyncio.to_thread(read_page, self.path, query)

    async def failures(self, since: float, bucket_s: int, tenant: str | None = None) -> list[FailureRow]:
        """Entries whose outcome is not ``ok`` since ``since``, per bucket, tenant and outcome (:mod:`.failures`)."""
        self._connection()
        return await asyncio.to_thread(read_failures, self.path, since, bucket_s, tenant)

    def _query(self, query: str, params: tuple[object, ...]) -> list[Any]:
        with self._db_lock:
            return self._connection().execute(query, params).fetchall()

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError(f"ledger {self.path} is not open: call start() first")
        return self._db


def _migrate(db: sqlite3.Connection) -> None:
    """Create the table, add the columns an older gateway's file lacks, then the indexes (some over those
    columns). In one transaction: processes sharing a ``data_dir`` may open the file at once."""
    db.execute(f"PRAGMA busy_timeout={_MIGRATION_WAIT_MS}")  # another process may be indexing a large file
    with write_transaction(db):
        db.execute(_TABLE)
        present = {row[1] for row in db.execute("PRAGMA table_info(entries)")}
        for column, statement in _ADDED_COLUMNS.items():
            if column not in present:
                db.execute(statement)
                log.info("ledger: added the column %r to a ledger file written by an older gateway", column)
    db.executescript(_INDEXES)
    db.execute(f"PRAGMA busy_timeout={BUSY_WAIT_MS}")


def _journaled_row(row: list[object]) -> Row | None:
    """A journal line as a row to insert; one an older gateway wrote gets an empty ``user``."""
    if len(row) == len(_COLUMNS) + 2:
        return tuple(row)
    if len(row) == _ROW_WITHOUT_USER:
        return (*row[:_USER], "", *row[_USER:])
    return None


def _killed_row(record: list[object]) -> Row:
    entry, hold_id = killed_entry(record)
    return (*_ROW_FIELDS(entry), hold_id, 0)
