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
import re
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
_GATHER_S = 0.05
"""How long the writer lets lines gather after the first: one wake-up and one write for many requests, so the
thread rarely takes the interpreter lock from the event loop."""
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


def fields(record: AccessRecord, timestamp: str) -> dict[str, Any]:
    """The line's fields, in a fixed order; numbers unknown for this request are ``None``."""
    usage = record.usage
    prompt_tokens = cached = output = None
    if usage:
        prompt_tokens, output = usage.get("prompt_tokens"), usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    ttft = record.ttft_s
    line: dict[str, Any] = {
        "time": timestamp,
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
        "prompt_tokens": prompt_tokens if type(prompt_tokens) is int else None,
        "cached_tokens": cached if type(cached) is int else None,
        "output_tokens": output if type(output) is int else None,
        "ttft_ms": None if ttft is None else round(ttft * 1000, 3),
        "duration_ms": round(record.duration_s * 1000, 3),
        "cost_usd": record.cost_usd,
    }
    if record.prompt is not None:
        line["prompt"] = record.prompt
    return line


class Timestamps:
    """RFC 3339 times in UTC with milliseconds; the last whole second's text is kept, lines coming many to a
    second. Each writer has its own."""

    __slots__ = ("_second", "_text")

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def __call__(self, epoch: float) -> str:
        whole = int(epoch)
        if whole != self._second:
            self._second, self._text = whole, time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(whole))
        return f"{self._text}{int((epoch - whole) * 1000):03d}Z"


def json_line(record: AccessRecord, timestamp: str) -> bytes:
    return orjson.dumps(fields(record, timestamp), default=str, option=orjson.OPT_APPEND_NEWLINE)


_PLAIN = re.compile(r"[!#-<>-\[\]-~]+")
"""A logfmt value written as it is: printable ASCII but for space, ``"``, ``=`` and backslash."""


def logfmt_line(record: AccessRecord, timestamp: str) -> bytes:
    """``key=value`` pairs; a value with a space, ``=``, a quote or anything but printable ASCII is quoted as a JSON
    string, an unknown one is empty."""
    parts = []
    for key, value in fields(record, timestamp).items():
        if value is None or value == "":
            parts.append(key + "=")
        elif value is True or value is False:
            parts.append(key + ("=true" if value else "=false"))
        elif type(value) is int or type(value) is float:
            parts.append(f"{key}={value!r}")
        else:
            text = value if type(value) is str else orjson.dumps(value, default=str).decode()
            parts.append(f"{key}={text}" if _PLAIN.fullmatch(text) else f"{key}={orjson.dumps(text).decode()}")
    return (" ".join(parts) + "\n").encode()


_FORMATTERS: dict[str, Callable[[AccessRecord, str], bytes]] = {"json": json_line, "logfmt": logfmt_line}


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
        self._timestamps = Timestamps()

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
            if batch[0] is not _STOP:
                time.sleep(_GATHER_S)
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
                lines.append(formatter(record, self._timestamps(record.time)))
            except Exception:  # one odd value must not stop the log
                log.exception("access log: could not format a record for %s", record.request_id)
        try:
            stream.write(b"".join(lines))
            stream.flush()
        except (OSError, ValueError):
            self.lost += len(lines)  # output closed or broken: nothing to do but count
