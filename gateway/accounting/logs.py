"""Single requests read back from the ledger: newest first, filtered, one page at a time.

Pages are cut by keyset, not by offset: each page ends with a cursor naming its last row's (time, rowid), and
the next page starts strictly below it. SQLite keeps the rowid in every index, so the ledger's indexes on
``(time)`` and ``(tenant, time)`` hand rows over in exactly that order: page 500 costs what page 1 does, and
entries booked between two pages neither repeat nor shift what follows.

Each read opens its own connection, on a worker thread: in WAL mode a reader neither waits for the ledger's
writer nor holds it up, and the event loop waits for neither. A read that scans too long (a rare ``user``
over two months of entries) is interrupted rather than left to run.
"""

from __future__ import annotations

import base64
import binascii
import math
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

MAX_LIMIT = 1000
DEFAULT_LIMIT = 100
READ_TIMEOUT_S = 10.0
_FIELDS = (
    "entry_id",
    "request_id",
    "time",
    "tenant",
    "route",
    "backend",
    "kind",
    "user",
    "outcome",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "cost_usd",
    "hosted_equivalent_usd",
)
_SELECT = f"SELECT rowid, {', '.join(_FIELDS)} FROM entries"
_ROWIDS = (-(2**63), 2**63 - 1)
"""SQLite's integers: a cursor past them was not written here (and could not be bound)."""


class BadCursor(ValueError):
    """A cursor this module did not write."""


class ReadTooSlow(Exception):
    """The read ran past its time: the filters match too few of the entries in the range to find a page."""


@dataclass(frozen=True, slots=True)
class LogQuery:
    """Which entries, newest first: every given filter must match; ``since`` inclusive, ``until`` exclusive."""

    tenant: str | None = None
    route: str | None = None
    user: str | None = None
    since: float | None = None
    until: float | None = None
    limit: int = DEFAULT_LIMIT
    cursor: str | None = None
    """The previous page's ``next_cursor``: this page starts below its last row."""


@dataclass(frozen=True, slots=True)
class LogPage:
    rows: list[dict[str, Any]]
    next_cursor: str | None
    """Where the next page starts; ``None`` on the last page."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": self.rows,
            "has_more": self.next_cursor is not None,
            "next_cursor": self.next_cursor,
        }


def encode_cursor(at: float, rowid: int) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([at, rowid])).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, int]:
    """The (time, rowid) a page ended at; :class:`BadCursor` for anything :func:`encode_cursor` did not write."""
    try:
        value = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError):
        raise BadCursor(cursor) from None
    match value:
        case [float() | int() as at, int() as rowid] if (
            math.isfinite(at) and _ROWIDS[0] <= rowid <= _ROWIDS[1] and bool not in (type(at), type(rowid))
        ):
            return float(at), rowid
    raise BadCursor(cursor)


def read(path: Path, sql: str, params: Sequence[object], *, timeout_s: float = READ_TIMEOUT_S) -> list[Any]:
    """The rows of one ``SELECT`` on the ledger file at ``path``, on a connection of its own that cannot
    write, interrupted past ``timeout_s`` (:class:`ReadTooSlow`). Blocking: run it on a thread."""
    db = sqlite3.connect(path, check_same_thread=False)
    try:
        db.execute("PRAGMA query_only=1")
        db.execute("PRAGMA busy_timeout=5000")
        db.set_progress_handler(_deadline(timeout_s), 10_000)
        try:
            return db.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if "interrupted" in str(exc):
                raise ReadTooSlow(f"reading the ledger took over {timeout_s:g} s") from None
            raise
    finally:
        db.close()


def read_page(path: Path, query: LogQuery) -> LogPage:
    """One page of ``query`` from the ledger file at ``path`` (blocking: run it on a thread)."""
    sql, params = _statement(query)
    found = read(path, sql, params)
    rows = [_row(values) for values in found[: query.limit]]
    more = len(found) > query.limit
    last = found[query.limit - 1] if more else None
    return LogPage(rows, encode_cursor(last[3], last[0]) if last is not None else None)


def _statement(query: LogQuery) -> tuple[str, list[object]]:
    where: list[str] = []
    params: list[object] = []
    for column in ("tenant", "route", "user"):
        value = getattr(query, column)
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if query.since is not None:
        where.append("time >= ?")
        params.append(query.since)
    if query.until is not None:
        where.append("time < ?")
        params.append(query.until)
    if query.cursor is not None:
        where.append("(time, rowid) < (?, ?)")
        params.extend(decode_cursor(query.cursor))
    sql = _SELECT + (f" WHERE {' AND '.join(where)}" if where else "") + " ORDER BY time DESC, rowid DESC LIMIT ?"
    params.append(query.limit + 1)  # one more says whether another page follows
    return sql, params


def _row(values: tuple[Any, ...]) -> dict[str, Any]:
    row = {"id": values[1], **dict(zip(_FIELDS[1:], values[2:], strict=True))}
    row["user"] = row["user"] or None  # none sent
    return row


def _deadline(timeout_s: float) -> Callable[[], bool]:
    """SQLite's progress handler: a true answer interrupts the statement."""
    until = time.monotonic() + timeout_s
    return lambda: time.monotonic() > until
