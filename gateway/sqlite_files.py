"""SQLite files that several gateway processes open at once: the ledger and the stored responses.

Workers of one gateway share their data directory, so each such file is opened in WAL mode (readers never wait
for the writer), waits for the others' locks rather than failing, and writes in transactions that take the
write lock at their start.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

BUSY_WAIT_MS = 5000
"""How long a statement waits for another process's lock before it fails."""
_WAL_WAIT_S = 10.0


def open_shared(path: Path, *, synchronous: Literal["FULL", "NORMAL"]) -> sqlite3.Connection:
    """A connection in autocommit mode to the file at ``path`` (created if missing), in WAL mode.

    ``FULL`` makes every commit survive a power cut; ``NORMAL`` only a killed process."""
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        db.execute(f"PRAGMA busy_timeout={BUSY_WAIT_MS}")
        _use_wal(db)
        db.execute(f"PRAGMA synchronous={synchronous}")
    except BaseException:
        db.close()
        raise
    return db


def _use_wal(db: sqlite3.Connection) -> None:
    """Two processes starting together both read a new file and then each needs it alone to switch it to WAL:
    SQLite answers one of them "database is locked" at once, without its busy handler (waiting there could
    deadlock). That one tries again, shortly, until the other has switched it."""
    deadline = time.monotonic() + _WAL_WAIT_S
    pause = 0.005
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


@contextlib.contextmanager
def write_transaction(db: sqlite3.Connection) -> Iterator[None]:
    """One write transaction on a connection in autocommit mode, taking the write lock at its start."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
