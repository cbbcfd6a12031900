"""The hot-path HTTP client: pooled keep-alive connections to replicas and hosted APIs.

One ``aiohttp`` session serves every backend; it is several times cheaper per request than httpx,
which matters because every client request crosses it once. Failures are mapped to
:class:`UpstreamError` kinds the gateway turns into 502/503/504.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Literal

import aiohttp

FailureKind = Literal["connect", "timeout", "protocol"]


class UpstreamError(Exception):
    """A backend could not be reached, answered too slowly, or broke the protocol."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float
    read_s: float
    """The longest silence allowed: before the headers (a non-streaming answer comes whole) or between chunks."""


class UpstreamResponse:
    """An open response; iterate :meth:`chunks` or :meth:`read`, and always :meth:`close`."""

    __slots__ = ("_response", "_timeouts", "headers", "status")

    def __init__(self, response: aiohttp.ClientResponse, timeouts: Timeouts) -> None:
        self._response = response
        self._timeouts = timeouts
        self.status = response.status
        self.headers: Mapping[str, str] = response.headers

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamError("timeout", "backend stopped sending the response body") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError("protocol", f"backend broke off the response: {type(exc).__name__}") from exc

    async def chunks(self) -> AsyncIterator[bytes]:
        """Yield bytes as they arrive, never waiting to fill a buffer."""
        content = self._response.content
        try:
            while True:
                data = await content.readany()
                if not data:
                    return
                yield data
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamError("timeout", "backend stalled mid-stream") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError("protocol", f"backend broke off the stream: {type(exc).__name__}") from exc

    def close(self) -> None:
        """Release the connection; an unfinished body closes it, which aborts the request upstream."""
        self._response.release() if self._response.content.at_eof() else self._response.close()


class UpstreamClient:
    """Pooled connections to every backend, created inside the running event loop."""

    def __init__(self, timeouts: Timeouts, pool_size: int = 1024) -> None:
        self._timeouts = timeouts
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self._pool_size, limit_per_host=0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            timeout=aiohttp.ClientTimeout(
                total=None,
                sock_connect=self._timeouts.connect_s,
                sock_read=self._timeouts.read_s,
            ),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> UpstreamResponse:
        """Send ``body`` and wait for the status line and headers."""
        assert self._session is not None, "UpstreamClient.start() was not awaited"
        try:
            response = await self._session.post(url, data=body, headers=headers)
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamError("timeout", "backend did not answer in time") from exc
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamError("connect", "backend refused the connection") from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise UpstreamError("connect", "backend closed the connection") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError("protocol", f"backend sent an invalid response: {type(exc).__name__}") from exc
        return UpstreamResponse(response, self._timeouts)
