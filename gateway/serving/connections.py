"""Client connections that cannot hold the gateway: a deadline on request headers and a cap per client address.

uvicorn closes an idle keep-alive connection, but not a new connection that never sends a byte, nor one that
sends its headers a byte at a time: each such socket is held as long as its client likes. This protocol,
uvicorn's own httptools protocol with two additions, closes a connection whose request headers have not all
arrived within ``header_timeout_s`` of its first byte (or of connecting), and refuses a client address more
than ``max_connections_per_client`` connections at once (429, then closed); what its parser refuses is answered
in OpenAI's error shape like everything else, and told to ``refused`` (the access log and the refusal count).
Request bodies have their own deadline where they are read (:func:`gateway.serving.exchange.read_body`).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from spillgate.gateway.errors import error_body

_TOO_MANY = error_body(429, "Too many connections from this address.", code="too_many_connections")
_TIMED_OUT = error_body(408, "The request headers did not arrive in time.", code="request_timeout")
_MALFORMED = error_body(400, "The request is not valid HTTP/1.1.", code="invalid_http")


def _raw_response(status: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


Refused = Callable[[int, str], None]
"""Told the status and error code of each answer the guard gives itself."""


def _nobody(status: int, code: str) -> None:
    pass


def guarded_protocol(
    header_timeout_s: float, max_connections_per_client: int, refused: Refused = _nobody
) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a header deadline and a per-address cap (0: no cap), for ``http=``.

    One class per server, so the connection counts belong to it rather than to the module."""
    open_per_client: Counter[str] = Counter()

    class GuardedProtocol(HttpToolsProtocol):
        _header_deadline: asyncio.TimerHandle | None = None
        _counted: str | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            address = self.client[0] if self.client else None
            if address is not None and max_connections_per_client:
                if open_per_client[address] >= max_connections_per_client:
                    transport.write(_raw_response(b"429 Too Many Requests", _TOO_MANY))
                    transport.close()
                    refused(429, "too_many_connections")
                    return
                open_per_client[address] += 1
                self._counted = address
            self._arm_header_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_deadline()
            if self._counted is not None:
                open_per_client[self._counted] -= 1
                if not open_per_client[self._counted]:
                    del open_per_client[self._counted]
                self._counted = None
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm_header_deadline()

        def on_headers_complete(self) -> None:
            self._disarm_header_deadline()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # Idle from here: uvicorn's keep-alive timer runs until the next request's first byte.
            self._disarm_header_deadline()

        def send_400_response(self, msg: str) -> None:
            """A request the HTTP parser refuses gets OpenAI's error shape too, not uvicorn's plain text."""
            self.transport.write(_raw_response(b"400 Bad Request", _MALFORMED))
            self.transport.close()
            refused(400, "invalid_http")

        def _arm_header_deadline(self) -> None:
            if self._header_deadline is None:
                self._header_deadline = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _disarm_header_deadline(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _headers_too_slow(self) -> None:
            self._header_deadline = None
            if not self.transport.is_closing():
                if self.cycle is None or self.cycle.response_complete:
                    self.transport.write(_raw_response(b"408 Request Timeout", _TIMED_OUT))
                    refused(408, "request_timeout")
                self.transport.close()

    return GuardedProtocol
