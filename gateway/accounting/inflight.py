"""Requests sent upstream and not yet booked, written ahead so that a killed process's streams still are.

A provider bills a request (a replica spends its time on it) from the moment it is sent, but the request's
ledger entry is written only when it ends (:mod:`.journal`): a ``kill -9`` in between would lose every
stream the process was serving. So before a request is sent, the entry it is to be booked at should it never
end (its worst case, outcome ``gateway_killed``) is written as one JSON line to an append-only file, with a
plain ``write`` like the journal's: a few microseconds, no fsync on the request's path, and it survives the
process being killed (the kernel has it). The real entry has the same id and replaces it: at the next start
the journal's rows are inserted first and these after (``INSERT OR IGNORE``), so only a request that never
ended is booked at its worst case, once. A request that ends without an entry (it never reached a backend)
writes a closing line instead.

The file stays short and reaches the disk: every second, if anything changed, the requests still open are
written to a fresh segment, which is fsync'd (off the event loop) before the older ones are deleted. A long
stream is carried forward rather than keeping its first segment alive, and what the machine losing power
can lose is the last second's new requests.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import orjson

from .journal import first_free_segment, leftover_segments, read_rows

log = logging.getLogger("spillgate.accounting")

COMPACT_INTERVAL_S = 1.0


class InFlight:
    """This process's requests in flight, on disk; segments are ``<stem>.<pid>-<n>.inflight``."""

    def __init__(self, directory: Path, stem: str) -> None:
        self._directory = directory
        self._stem = stem
        self._fd: int | None = None
        self._segment = 0
        self._oldest = 0
        """This process's segments still on disk are ``_oldest`` .. ``_segment``."""
        self._open: dict[str, bytes] = {}
        """Entry id -> its line, for each request sent and not yet ended."""
        self._changed = False
        self._failing = False
        self._leftovers: list[Path] = []

    def recover(self) -> list[list[object]]:
        """The records of the requests a previous process left open, and a fresh segment."""
        self._leftovers = leftover_segments(self._directory, f"{self._stem}.*.inflight")
        opened: dict[str, list[object]] = {}
        for line in read_rows(self._leftovers):
            if len(line) > 1:
                opened[str(line[0])] = line  # carried forward: the same request, once
            elif line:
                opened.pop(str(line[0]), None)  # closed without an entry
        self._segment = self._oldest = first_free_segment(self._leftovers)
        self._fd = self._create(self._segment)
        return list(opened.values())

    def recovered(self) -> None:
        """The rows :meth:`recover` returned are in the ledger: their segments can go."""
        for path in self._leftovers:
            path.unlink(missing_ok=True)
        self._leftovers = []

    # Per request: nothing here waits, and a failing disk never fails a request --------------------------

    def open(self, record: Sequence[object]) -> None:
        """``record`` (its first field the entry id) is booked should this process die before :meth:`close`
        or :meth:`abandon`."""
        line = orjson.dumps(record) + b"\n"
        self._open[str(record[0])] = line
        self._changed = True
        self._write(line)

    def close(self, entry_id: str) -> None:
        """The request's real entry is journaled: it replaces the worst case (nothing to write)."""
        if self._open.pop(entry_id, None) is not None:
            self._changed = True

    def abandon(self, entry_id: str) -> None:
        """The request ended without an entry (it never reached a backend): nothing is to be booked."""
        if self._open.pop(entry_id, None) is not None:
            self._changed = True
            self._write(orjson.dumps((entry_id,)) + b"\n")

    def _write(self, line: bytes) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, line)
        except OSError as exc:
            if not self._failing:
                log.error("requests in flight could not be written ahead (%s): a kill now would lose them", exc)
            self._failing = True
        else:
            self._failing = False

    # In the background ----------------------------------------------------------------------------------

    async def compact_forever(self) -> None:
        while True:
            await asyncio.sleep(COMPACT_INTERVAL_S)
            try:
                await self.compact()
            except OSError as exc:  # the older segments stay: nothing is lost, the next turn tries again
                log.warning("requests in flight: compaction failed (%s)", exc)

    async def compact(self) -> None:
        """Write the requests still open to a fresh segment, fsync it, and delete the older segments."""
        if not self._changed or self._fd is None:
            return
        self._changed = False
        fd = self._create(self._segment + 1)
        try:
            os.write(fd, b"".join(self._open.values()))
        except BaseException:
            os.close(fd)
            self._path(self._segment + 1).unlink(missing_ok=True)
            self._changed = True
            raise
        previous, self._fd = self._fd, fd
        self._segment += 1
        os.close(previous)
        await asyncio.to_thread(os.fsync, fd)
        for segment in range(self._oldest, self._segment):
            self._path(segment).unlink(missing_ok=True)
        self._oldest = self._segment

    def close_file(self) -> None:
        """A clean stop. Requests still open stay on disk, for the next start to book."""
        if self._fd is None:
            return
        os.close(self._fd)
        self._fd = None
        if not self._open:
            for segment in range(self._oldest, self._segment + 1):
                self._path(segment).unlink(missing_ok=True)

    def _create(self, segment: int) -> int:
        self._directory.mkdir(parents=True, exist_ok=True)
        return os.open(self._path(segment), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def _path(self, segment: int) -> Path:
        return self._directory / f"{self._stem}.{os.getpid()}-{segment}.inflight"
