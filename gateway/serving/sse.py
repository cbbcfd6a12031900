"""Server-sent-event framing for the streaming relay.

The relay forwards whole events only (upstream reads can split one anywhere) and looks inside the one
event it cares about: the final usage chunk, which it may strip when the client did not ask for it.
SGLang ends lines with LF; an upstream ending them with CRLF (the SSE spec allows both) is relayed with LF,
so its events are still found and streamed one by one rather than held until the response ends.

Every event is checked before it is relayed: its data must be a JSON object or ``[DONE]`` (comments and the
``event``/``id``/``retry`` fields pass). A replica that sends anything else is broken, and its bytes must not
reach a client as if they were an answer: :class:`InvalidEvent` says so (about 1 us per event, with orjson).
"""

from __future__ import annotations

from typing import Any

import orjson

_USAGE_MARKS = (b'"usage":{', b'"usage": {')
_SEPARATOR = b"\n\n"
_MAX_EVENT_BYTES = 4 << 20
"""An upstream that sends more than this without ending an event is not streaming events (nor bounded)."""
_TEXT_MARKS = tuple(
    mark
    for key in (b"content", b"reasoning_content", b"text", b"arguments")
    for mark in (b'"' + key + b'":"', b'"' + key + b'": "')
)


class InvalidEvent(ValueError):
    """The upstream sent something that is not an OpenAI stream event."""


class EventRelay:
    """Feeds raw upstream bytes in, gets complete events out, and remembers the usage it saw."""

    __slots__ = ("_pending", "_strip_usage", "events", "usage")

    def __init__(self, *, strip_usage: bool) -> None:
        self._pending = b""
        self._strip_usage = strip_usage
        self.events = 0
        self.usage: dict[str, Any] | None = None

    def feed(self, data: bytes) -> bytes:
        """Return the complete events in ``pending + data`` (possibly none), keeping the partial tail; raises
        :class:`InvalidEvent` for an event that is not OpenAI's."""
        if self._pending:
            data = self._pending + data
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")  # a lone CR at the end waits in the tail for its LF
        end = data.rfind(_SEPARATOR)
        if end < 0:
            if len(data) > _MAX_EVENT_BYTES:
                raise InvalidEvent(f"no end of event in {len(data)} bytes")
            self._pending = data
            return b""
        end += len(_SEPARATOR)
        self._pending = data[end:]
        complete = data[:end]
        count = complete.count(_SEPARATOR)
        if count == 1 and complete.startswith(b"data: {") and b"\n" not in complete[:-2]:
            _check_json(complete[6:-2])  # the usual read: one event of one data line
        else:
            for event in complete.split(_SEPARATOR)[:-1]:
                check_event(event)
        self.events += count
        if _has_usage(complete):
            complete = self._take_usage(complete)
        return complete

    def flush(self) -> bytes:
        """Whatever is left when the upstream closes (a final event without its blank line), checked too."""
        rest, self._pending = self._pending, b""
        if rest.strip():
            check_event(rest.strip(b"\n"))
        return rest

    def _take_usage(self, complete: bytes) -> bytes:
        kept = []
        for event in complete.split(_SEPARATOR)[:-1]:
            if event.startswith(b"data:") and _has_usage(event):
                try:
                    chunk = orjson.loads(event[5:])  # JSON ignores the optional space after the colon
                except orjson.JSONDecodeError:
                    chunk = None
                if isinstance(chunk, dict) and isinstance(chunk.get("usage"), dict):
                    self.usage = chunk["usage"]
                    if self._strip_usage and not chunk.get("choices"):
                        continue
            kept.append(event + _SEPARATOR)
        return b"".join(kept)


def check_event(event: bytes) -> None:
    """Raise :class:`InvalidEvent` unless ``event`` (its lines, without the blank line) is an OpenAI stream event:
    data that is one JSON object or ``[DONE]``, besides comments and the other SSE fields."""
    data: list[bytes] = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            data.append(line[6:] if line[5:6] == b" " else line[5:])
        elif line and not line.startswith(_OTHER_FIELDS):
            raise InvalidEvent(f"not a server-sent event line: {line[:40]!r}")
    if not data:
        return  # a comment (a keep-alive) or an empty event
    payload = b"\n".join(data)
    if payload.strip() != b"[DONE]":
        _check_json(payload)


def _check_json(payload: bytes) -> None:
    try:
        parsed = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise InvalidEvent(f"event data is not JSON: {payload[:40]!r}") from None
    if not isinstance(parsed, dict):
        raise InvalidEvent(f"event data is not a JSON object: {payload[:40]!r}")


_OTHER_FIELDS = (b":", b"event:", b"id:", b"retry:")


def carries_text(events: bytes) -> bool:
    """Whether some chunk in ``events`` carries generated text: not only a role, a finish reason or usage, which
    SGLang sends in the same pass as the text before or after them."""
    for mark in _TEXT_MARKS:
        start = events.find(mark)
        while start >= 0:
            end = start + len(mark)
            if events[end : end + 1] != b'"':
                return True
            start = events.find(mark, end)
    return False


def _has_usage(data: bytes) -> bool:
    return _USAGE_MARKS[0] in data or _USAGE_MARKS[1] in data
