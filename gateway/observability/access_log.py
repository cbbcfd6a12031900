"""The access log: one structured line per request (JSON or logfmt), written off the request's path.

The request path only builds an :class:`AccessRecord` of values it already holds and puts it on a bounded queue;
one writer thread turns records into lines and writes whatever has gathered in one write and one flush. A
writer that falls behind (a blocked standard output) costs lines, never requests: past ``capacity`` waiting
records new ones are dropped and counted, and the next line written is preceded by a warning saying how many.

The standard library's ``logging.handlers.QueueHandler`` and ``QueueListener`` were the first candidates and do
not fit this path: ``QueueHandler.prepare`` formats the message in the caller (the request path), a full bounded
queue makes it print a traceback for every record, and ``QueueListener`` hands records one at a time to a handler
that flushes after each, so under load the writer would take the interpreter lock and make a system call per
line, competing with the event loop for it.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal

import orjson

log = logging.getLogger("spillgate.access")

Format = Literal["json", "logfmt"]

_BATCH = 4096
"""The most records turned into one write."""
_STOP = object()


@dataclass(slots=True)
class AccessRecord:
    """One finished request, as the request path hands it over: raw values, turned into fields by the writer."""

    time: float
    """When the answer ended (or the client went), ``time.time()``."""
    request_id: str
    method: str
    path: str
    status: int
    """The status sent; 499 when the client went before any answer."""
    duration_s: float
    error_code: str = ""
    tenant: str = ""
    route: str = ""
    backend: str = ""
    reason: str = ""
    outcome: str = ""
    trace_id: str = ""
    stream: bool = False
    usage: Mapping[str, Any] | None = None
    """The backend's ``usage``, as it reported it (tokens are read from it by the writer)."""
    ttft_s: float | None = None
    cost_usd: float | None = None
    prompt: Any = None
    """The prompt (chat ``messages`` or a completion's ``prompt``): only with ``logging.include_prompt``."""


def fields(record: AccessRecord) -> dict[str, Any]:
    """The line's fields, in a fixed order; numbers unknown for this request are ``None``."""
    usage = record.usage or {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    line: dict[str, Any] = {
        "time": _timestamp(record.time),
        "request_id": record.request_id,
        "trace_id": record.trace_id,
        "method": record.method,
        "path": record.path,
        "status": record.status,
        "error_code": record.error_code,
        "tenant": record.tenant,
        "route": record.route,
        "backend": record.backend,
        "reason": record.reason,
        "outcome": record.outcome,
        "stream": record.stream,
        "prompt_tokens": _count(usage.get("prompt_tokens")),
        "cached_tokens": _count(cached),
        "output_tokens": _count(usage.get("completion_tokens")),
        "ttft_ms": None if record.ttft_s is None else round(record.ttft_s * 1000, 3),
        "duration_ms": round(record.duration_s * 1000, 3),
        "cost_usd": record.cost_usd,
    }
    if record.prompt is not None:
        line["prompt"] = record.prompt
    return line


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _timestamp(epoch: float) -> str:
    """RFC 3339 in UTC with milliseconds."""
    whole = int(epoch)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{int((epoch - whole) * 1000):03d}Z"


def json_line(record: AccessRecord) -> bytes:
    return orjson.dumps(fields(record), default=str) + b"\n"


def logfmt_line(record: AccessRecord) -> bytes:
    """``key=value`` pairs; a value with a space, ``=``, a quote or a control character is quoted."""
    parts = []
    for key, value in fields(record).items():
        parts.append(f"{key}={_logfmt_value(value)}")
    return (" ".join(parts) + "\n").encode()


def _logfmt_value(value: object) -> str:
    if value is None:
        return ""
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    if text and all(c > " " and c not in '"=\\' and c.isprintable() for c in text):
        return text
    return orjson.dumps(text).decode()  # a JSON string: quoted, with quotes, backslashes and newlines escaped


_FORMATTERS: dict[str, Callable[[AccessRecord], bytes]] = {"json": json_line, "logfmt": logfmt_line}


class AccessLog:
    """Takes records on the event loop's thread and writes them as lines from a thread of its own.

    ``format`` is read for every batch, so a live config change applies to the next lines."""

    def __init__(self, format: Callable[[], Format], stream: BinaryIO | None = None, *, capacity: int = 65536) -> None:
        self._format = format
        self._stream = stream
        self._capacity = capacity
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.running = False
        """Whether records are taken: between :meth:`start` and :meth:`stop`."""
        self.dropped = 0
        """Records not queued because the writer had ``capacity`` waiting (the loop's thread counts them)."""
        self.lost = 0
        """Lines the output refused (the writer's thread counts them)."""
        self._reported = 0

    def submit(self, record: AccessRecord) -> None:
        """Queue ``record`` for the writer; dropped (and counted) when the writer is that far behind."""
        if self._queue.qsize() >= self._capacity:
            self.dropped += 1
            return
        self._queue.put(record)

    def start(self) -> None:
        if self.running:
            return
        self.running = True
        self._thread = threading.Thread(target=self._write_forever, name="spillgate-access-log", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Write what is queued, then stop the writer."""
        if not self.running:
            return
        self.running = False
        self._queue.put(_STOP)
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _write_forever(self) -> None:
        stream = self._stream if self._stream is not None else sys.stdout.buffer
        while True:
            batch = [self._queue.get()]
            while len(batch) < _BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._write(stream, [r for r in batch if isinstance(r, AccessRecord)])
            if any(r is _STOP for r in batch):
                return

    def _write(self, stream: BinaryIO, records: list[AccessRecord]) -> None:
        if self.dropped != self._reported:
            log.warning("access log: %d line(s) dropped, the writer fell behind", self.dropped - self._reported)
            self._reported = self.dropped
        if not records:
            return
        formatter = _FORMATTERS[self._format()]
        lines = []
        for record in records:
            try:
                lines.append(formatter(record))
            except Exception:  # one odd value must not stop the log
                log.exception("access log: could not format a record for %s", record.request_id)
        try:
            stream.write(b"".join(lines))
            stream.flush()
        except (OSError, ValueError):
            self.lost += len(lines)  # output closed or broken: nothing to do but count
