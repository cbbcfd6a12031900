"""The hot-path HTTP client against a scripted raw TCP server: keep-alive, chunking, failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from spillgate.backends.http1 import ConnectFailed, Http1Client, ProtocolFailure, ReadTimeout
from tests.support.procs import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return await reader.readexactly(length)


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


class Server:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.closed = 0
        self.url = ""

    async def __aenter__(self) -> Server:
        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                self.closed += 1
                writer.close()

        self._server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()


@pytest.fixture
async def client() -> AsyncIterator[Http1Client]:
    http = Http1Client(connect_timeout=1.0, read_timeout=0.5)
    yield http
    http.close()


async def echo_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        body = await read_request(reader)
        writer.write(ok(body))


async def test_keep_alive_reuses_one_connection(client: Http1Client) -> None:
    async with Server(echo_forever) as server:
        for i in range(5):
            response = await client.post(server.url, "/v1/x", b'{"n":%d}' % i, [(b"x-a", b"1")])
            assert response.status == 200
            assert (b"content-type", b"application/json") in response.headers
            assert await response.read() == b'{"n":%d}' % i
            response.close()
        assert server.connections == 1


async def test_chunked_stream_arrives_piece_by_piece(client: Http1Client) -> None:
    release = asyncio.Event()

    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await release.wait()
        writer.write(b"6\r\n world\r\n0\r\n\r\n")
        await asyncio.sleep(1)

    async with Server(chunked) as server:
        response = await client.post(server.url, "/", b"{}")
        pieces = response.iter_bytes()
        assert await anext(pieces) == b"hello", "the first chunk must not wait for the rest"
        release.set()
        assert b"".join([p async for p in pieces]) == b" world"
        response.close()


async def test_body_delimited_by_close(client: Http1Client) -> None:
    async def close_delimited(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()

    async with Server(close_delimited) as server:
        response = await client.post(server.url, "/", b"{}")
        assert await response.read() == b"all of it"
        response.close()


async def test_stale_pooled_connection_is_retried_once(client: Http1Client) -> None:
    async def one_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(b"first"))
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")  # take the next request, then hang up without answering

    async with Server(one_then_close) as server:
        first = await client.post(server.url, "/", b"{}")
        assert await first.read() == b"first"
        first.close()
        second = await client.post(server.url, "/", b"{}")
        assert await second.read() == b"first"
        second.close()
        assert server.connections == 2


async def test_refused_connection(client: Http1Client) -> None:
    with pytest.raises(ConnectFailed):
        await client.post(f"http://127.0.0.1:{free_port()}", "/", b"{}")


async def test_silent_backend_times_out_before_and_during_the_body(client: Http1Client) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    async with Server(silent) as server:
        with pytest.raises(ReadTimeout):
            await client.post(server.url, "/", b"{}")

    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n")
        await asyncio.sleep(5)

    async with Server(stalls) as server:
        response = await client.post(server.url, "/", b"{}")
        pieces = response.iter_bytes()
        assert await anext(pieces) == b"hi"
        with pytest.raises(ReadTimeout):
            await anext(pieces)
        response.close()


async def test_backend_hangs_up_mid_body(client: Http1Client) -> None:
    async def hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()

    async with Server(hangs_up) as server:
        response = await client.post(server.url, "/", b"{}")
        with pytest.raises(ProtocolFailure):
            await response.read()
        response.close()


async def test_garbage_response(client: Http1Client) -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SPDY/9 what\r\n\r\n")
        await asyncio.sleep(1)

    async with Server(garbage) as server:
        with pytest.raises(ProtocolFailure):
            await client.post(server.url, "/", b"{}")


async def test_closing_an_unfinished_response_drops_the_connection(client: Http1Client) -> None:
    closed = asyncio.Event()

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        try:
            while True:
                writer.write(b"1\r\nx\r\n")
                await writer.drain()
                await asyncio.sleep(0.01)
        except ConnectionError:
            closed.set()

    async with Server(endless) as server:
        response = await client.post(server.url, "/", b"{}")
        assert await anext(response.iter_bytes())
        response.close()
        await asyncio.wait_for(closed.wait(), 2)


async def test_retaining_some_origins_closes_the_others_connections(client: Http1Client) -> None:
    async def closed(server: Server, count: int) -> None:
        for _ in range(100):
            if server.closed == count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{server.closed} connections closed, expected {count}")

    async with Server(echo_forever) as kept, Server(echo_forever) as dropped:
        response = await client.post(kept.url, "/v1/x", b"{}")
        await response.read()
        response.close()
        busy = await client.post(dropped.url, "/v1/x", b"{}")  # in use across the change
        idle = await client.post(dropped.url, "/v1/x", b"{}")
        await idle.read()
        idle.close()
        client.retain([kept.url])
        await closed(dropped, 1)  # the idle one at once
        await busy.read()
        busy.close()  # finished cleanly, but its origin is gone: not pooled again
        await closed(dropped, 2)
        assert dropped.connections == 2
        assert kept.closed == 0, "the retained origin keeps its idle connection"
        response = await client.post(kept.url, "/v1/x", b"{}")
        response.close()
        assert kept.connections == 1
