"""W3C Trace Context headers (``traceparent``, ``tracestate``) as clients send them: read, checked, passed on.

A proxy that takes no part in a trace passes the client's headers on unchanged; one that does replaces the
parent id with its own span's. Either way a malformed ``traceparent`` is dropped rather than forwarded, and a
``tracestate`` travels only with a valid ``traceparent`` (https://www.w3.org/TR/trace-context/).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[ -~]*)?")
_MAX_TRACESTATE = 512
_ZERO_TRACE = b"0" * 32
_ZERO_PARENT = b"0" * 16

TraceHeaders = tuple[tuple[bytes, bytes], ...]
"""Headers to send a backend: ``traceparent`` and, when there is one, ``tracestate``."""


def client_trace(headers: Iterable[tuple[bytes, bytes]]) -> TraceHeaders:
    """The client's trace headers, ready to pass on; ``()`` when it sent no valid ``traceparent``."""
    parent = state = b""
    for name, value in headers:
        if name == b"traceparent":
            parent = value
        elif name == b"tracestate":
            state = value
    if not parent or not valid_traceparent(parent):
        return ()
    if state and len(state) <= _MAX_TRACESTATE and state.isascii() and state.decode().isprintable():
        return ((b"traceparent", parent), (b"tracestate", state))
    return ((b"traceparent", parent),)


def valid_traceparent(value: bytes) -> bool:
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return False
    version, trace_id, parent_id, _flags, rest = match.groups()
    if version == b"ff" or (version == b"00" and rest):
        return False
    return trace_id != _ZERO_TRACE and parent_id != _ZERO_PARENT


def trace_id_of(headers: TraceHeaders) -> str:
    """The trace id (32 hex digits) in headers from :func:`client_trace`; ``""`` without them."""
    return headers[0][1][3:35].decode() if headers else ""


def traceparent(trace_id: int, span_id: int, flags: int) -> bytes:
    """A version-00 ``traceparent`` naming a span of this process as the parent."""
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}".encode()
