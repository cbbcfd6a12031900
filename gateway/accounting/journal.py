"""Ledger entries handed to the kernel the moment a request is booked, so a killed process loses none.

The ledger commits to SQLite in batches, a tenth of a second apart, and a request's entry reaches that batch
only once its hold is settled in Redis: a ``kill -9`` in between would lose it. So each entry is also
written, as one JSON line, to an append-only journal file when the request ends, before anything awaits:
a plain ``write`` (no fsync), which survives the process being killed (the kernel has it), though not the
machine losing power (that is what SQLite's fsync'd commits are for). At start the journal's lines are
inserted into the ledger (``INSERT OR IGNORE``: those already committed are skipped) and replayed to Redis
like any unshipped entry (Redis counts an id once). The journal is kept in segments, one per commit batch,
and a segment is deleted once every entry written to it is committed.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import orjson

Row = tuple[object, ...]


class Journal:
    def __init__(self, directory: Path, stem: str) -> None:
        self._directory = directory
        self._stem = stem
        self._segment = 0
        self._fd: int | None = None
        self._segment_of: dict[str, int] = {}
        """Entry id -> the segment it was written to, until it is committed."""
        self._open: Counter[int] = Counter()
        """Entries of each segment not yet committed."""

    def recover(self) -> list[list[object]]:
        """Every row a previous process journaled (some may be committed already), and a fresh segment."""
        leftovers = leftover_segments(self._directory, f"{self._stem}.*.journal")
        rows = read_rows(leftovers)
        self._leftovers = leftovers
        self._segment = first_free_segment(leftovers)
        self._open_segment()
        return rows

    def recovered(self) -> None:
        """The rows :meth:`recover` returned are committed: their segments can go."""
        for path in self._leftovers:
            path.unlink(missing_ok=True)
        self._leftovers = []

    def write(self, row: Row, entry_id: str) -> None:
        if self._fd is None:
            return
        os.write(self._fd, orjson.dumps(row) + b"\n")
        self._segment_of[entry_id] = self._segment
        self._open[self._segment] += 1

    def rotate(self) -> None:
        """Start a new segment (at each commit batch, so segments stay small and go soon)."""
        previous = self._segment
        self._segment += 1
        self._open_segment()
        if not self._open[previous]:
            self._drop(previous)

    def committed(self, entry_ids: Iterable[str]) -> None:
        for entry_id in entry_ids:
            segment = self._segment_of.pop(entry_id, None)
            if segment is None:
                continue
            self._open[segment] -= 1
            if not self._open[segment] and segment != self._segment:
                self._drop(segment)

    def close(self) -> None:
        """Everything is committed (a clean stop): no journal is left."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if not self._segment_of:
            self._path(self._segment).unlink(missing_ok=True)

    def _open_segment(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._directory.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self._path(self._segment), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def _drop(self, segment: int) -> None:
        del self._open[segment]
        self._path(segment).unlink(missing_ok=True)

    def _path(self, segment: int) -> Path:
        return self._directory / f"{self._stem}.{os.getpid()}-{segment}.journal"


def leftover_segments(directory: Path, pattern: str) -> list[Path]:
    """Segments (``<stem>.<pid>-<n>.<suffix>``) whose process is gone, oldest first. A process still running
    (one sharing this directory) commits its own."""
    leftovers = [path for path in directory.glob(pattern) if not _alive(_owner(path))]
    leftovers.sort(key=lambda path: (_owner(path), _number(path)))
    return leftovers


def read_rows(paths: Iterable[Path]) -> list[list[object]]:
    """The JSON array lines of ``paths``, in order."""
    rows: list[list[object]] = []
    for path in paths:
        for line in path.read_bytes().splitlines():
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # the last line of a killed process may be cut short: it never completed
            if isinstance(row, list):
                rows.append(row)
    return rows


def first_free_segment(leftovers: Iterable[Path]) -> int:
    """This process's first segment number: after any leftover of an earlier process that had this pid (a
    container's gateway is often pid 1), whose files are deleted once recovered and must not be reopened."""
    mine = [_number(path) for path in leftovers if _owner(path) == os.getpid()]
    return max(mine, default=0) + 1


def _owner(path: Path) -> int:
    """The pid of the process that wrote a segment (``<stem>.<pid>-<n>.journal``)."""
    return int(path.name.rsplit(".", 2)[-2].split("-")[0])


def _number(path: Path) -> int:
    return int(path.name.rsplit(".", 2)[-2].split("-")[1])


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # a segment of an earlier process that had this pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
