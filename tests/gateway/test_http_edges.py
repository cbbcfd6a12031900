"""What the HTTP layer answers outside the API's happy path: OpenAI's error shape for anything its parser
refuses, redirects that never name the host a client claimed, and a request id that cannot grow a response."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from tests.support.gateway import TENANT_KEY, gateway_config, start_gateway, start_replica
from tests.support.procs import RunningProcess

AUTH = {"authorization": f"Bearer {TENANT_KEY}"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    log_dir: Path = tmp_path_factory.mktemp("http-edges")
    replica = start_replica(log_dir, "--time-scale", "0.01")
    proc = start_gateway(gateway_config([replica.url]), log_dir)
    yield proc
    proc.stop()
    replica.stop()


def exchange(gateway: RunningProcess, request: bytes) -> tuple[bytes, dict[str, str], bytes]:
    """Send raw bytes; the status line, headers and body of what came back before the gateway closed."""
    address = urlsplit(gateway.url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return status.encode(), headers, body


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE / HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET /health HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    ],
)
def test_what_the_parser_refuses_is_an_openai_error(gateway: RunningProcess, request_bytes: bytes) -> None:
    status, headers, body = exchange(gateway, request_bytes)
    assert status.startswith(b"HTTP/1.1 400"), status
    assert headers["content-type"] == "application/json"
    assert orjson.loads(body)["error"]["code"] == "invalid_http"


def test_a_trailing_slash_redirects_to_a_path_never_to_the_claimed_host(gateway: RunningProcess) -> None:
    status, headers, _ = exchange(
        gateway, b"GET /dashboard/ HTTP/1.1\r\nhost: evil.example\r\nconnection: close\r\n\r\n"
    )
    assert status.startswith(b"HTTP/1.1 307") and headers["location"] == "/dashboard"
    response = httpx.get(gateway.url + "/health/?verbose=1", headers={"host": "evil.example"})
    assert response.status_code == 307 and response.headers["location"] == "/health?verbose=1"
    # A path that would read as another host, or one that is not served, is simply not found.
    for path in (b"//evil.example/", b"/no-such-page/"):
        status, headers, body = exchange(gateway, b"GET " + path + b" HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 404") and "location" not in headers
        assert orjson.loads(body)["error"]["code"] == "unsupported_endpoint"


def test_a_huge_request_id_is_replaced_not_echoed(gateway: RunningProcess) -> None:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    huge = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=AUTH | {"x-request-id": "r" * 60_000})
    assert huge.status_code == 200, huge.text
    assert len(huge.headers["x-request-id"]) <= 128 and "rrrr" not in huge.headers["x-request-id"]
    kept = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=AUTH | {"x-request-id": "trace-1"})
    assert kept.headers["x-request-id"] == "trace-1"
