"""Clients that send slowly, or not at all, cannot hold the gateway: no slot before a valid key and a whole
body, deadlines on headers and bodies, and a cap on connections per client address."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.gateway import TENANT_KEY, gateway_config, start_gateway, start_replica
from tests.support.procs import RunningProcess

AUTH = {"authorization": f"Bearer {TENANT_KEY}"}
BODY = {"model": "chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    log_dir: Path = tmp_path_factory.mktemp("slow-clients")
    replica = start_replica(log_dir, "--time-scale", "0.01")
    config = gateway_config(
        [replica.url],
        limits={"max_in_flight": 4, "max_connections_per_client": 12, "max_reading_body_bytes": 1500},
        timeouts={"client_headers_s": 1.0, "client_body_s": 1.5},
    )
    gateway = start_gateway(config, log_dir)
    yield gateway
    gateway.stop()
    replica.stop()


def _connect(gateway: RunningProcess) -> socket.socket:
    address = urlsplit(gateway.url)
    sock = socket.create_connection((address.hostname, address.port), timeout=10)
    return sock


def _start_slow_body(gateway: RunningProcess, key: str | None) -> socket.socket:
    """A POST whose headers promise a 1,000-byte body, of which only one byte is sent."""
    sock = _connect(gateway)
    auth = f"authorization: Bearer {key}\r\n" if key else ""
    sock.sendall(
        (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{auth}"
            "content-length: 1000\r\n\r\n{"
        ).encode()
    )
    return sock


def _start_partial_body(gateway: RunningProcess, sent: int) -> socket.socket:
    """A POST with a key whose headers promise 1,000 bytes, of which ``sent`` arrive."""
    sock = _connect(gateway)
    sock.sendall(
        (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {TENANT_KEY}\r\ncontent-length: 1000\r\n\r\n"
        ).encode()
        + b" " * sent
    )
    return sock


def _answer(sock: socket.socket) -> bytes:
    """What the gateway sent before closing; raises if it keeps the connection open 10 s (far past its deadlines)."""
    sock.settimeout(10)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_slow_bodies_without_a_key_take_no_slot(guarded: RunningProcess) -> None:
    socks = [_start_slow_body(guarded, None) for _ in range(8)]  # twice max_in_flight
    try:
        time.sleep(0.3)
        response = httpx.post(guarded.url + "/v1/chat/completions", json=BODY, headers=AUTH, timeout=30)
        assert response.status_code == 200, response.text
        # Refused at the key, without waiting for the body.
        for sock in socks:
            assert _answer(sock).startswith(b"HTTP/1.1 401")
    finally:
        for sock in socks:
            sock.close()


def test_a_slow_body_with_a_key_holds_no_slot_and_gets_408(guarded: RunningProcess) -> None:
    socks = [_start_slow_body(guarded, TENANT_KEY) for _ in range(8)]
    try:
        time.sleep(0.3)
        response = httpx.post(guarded.url + "/v1/chat/completions", json=BODY, headers=AUTH, timeout=30)
        assert response.status_code == 200, response.text
        for sock in socks:
            answer = _answer(sock)
            assert answer.startswith(b"HTTP/1.1 408"), answer
            assert b'"code":"request_timeout"' in answer
    finally:
        for sock in socks:
            sock.close()


def test_slow_headers_and_silent_connections_are_closed(guarded: RunningProcess) -> None:
    silent = _connect(guarded)
    trickling = _connect(guarded)
    try:
        trickling.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")  # and nothing more
        assert _answer(trickling).startswith(b"HTTP/1.1 408")
        assert _answer(silent).startswith(b"HTTP/1.1 408")
    finally:
        silent.close()
        trickling.close()


def test_an_address_with_too_many_connections_is_refused(guarded: RunningProcess) -> None:
    socks = [_connect(guarded) for _ in range(12)]
    try:
        time.sleep(0.2)
        extra = _connect(guarded)
        answer = _answer(extra)
        assert answer.startswith(b"HTTP/1.1 429") and b"too_many_connections" in answer
        extra.close()
    finally:
        for sock in socks:
            sock.close()
    deadline = time.monotonic() + 5  # closed ones no longer count
    while True:
        try:
            response = httpx.post(guarded.url + "/v1/chat/completions", json=BODY, headers=AUTH, timeout=30)
        except httpx.HTTPError:
            response = None
        if response is not None and response.status_code == 200:
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_bodies_still_arriving_are_bounded_in_bytes(guarded: RunningProcess) -> None:
    first, second = _start_partial_body(guarded, 700), _start_partial_body(guarded, 700)
    try:
        time.sleep(0.3)
        third = _start_partial_body(guarded, 700)  # 2,100 bytes arriving, past the 1,500 allowed
        answer = _answer(third)
        assert answer.startswith(b"HTTP/1.1 503") and b'"code":"overloaded"' in answer
        third.close()
        # A whole body arrives in one piece and is never counted: served meanwhile.
        response = httpx.post(guarded.url + "/v1/chat/completions", json=BODY, headers=AUTH, timeout=30)
        assert response.status_code == 200, response.text
        for sock in (first, second):
            assert _answer(sock).startswith(b"HTTP/1.1 408")
    finally:
        first.close()
        second.close()
