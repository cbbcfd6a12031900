"""Clean answers: the paths without ``/v1``, OpenAI-shaped 404s and 405s that say what is served, answers the
official SDK reads without a warning, and errors that never name the replica behind them.

Real processes throughout: simulated SGLang replicas, a gateway, the ``openai`` SDK, and a stand-in replica
(a small HTTP server in its own process) that passes its probes and fails every completion.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.support.gateway import TENANT_KEY, gateway_config, replica_name, start_gateway, start_replica
from tests.support.procs import RunningProcess, free_port, start_process

AUTH = {"authorization": f"Bearer {TENANT_KEY}"}
HELLO = [{"role": "user", "content": "Name three prime numbers."}]

# A replica stand-in: healthy to every probe; a completion gets a 500 that names the replica, its address and
# host:port, or (max_tokens 400) a 400 in SGLang's shape whose message repeats them.
_FAILING_REPLICA = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port = int(sys.argv[1])
address = f"http://127.0.0.1:{port}"
metrics = b"sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\nsglang:token_usage 0\nsglang:prompt_tokens_total 0\n"

class Handler(BaseHTTPRequestHandler):
    def answer(self, status, body, kind="application/json"):
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path in ("/ready", "/health"):
            self.answer(200, b"ok", "text/plain")
        elif self.path == "/metrics":
            self.answer(200, metrics, "text/plain")
        elif self.path == "/v1/models":
            self.answer(200, json.dumps({"object": "list", "data": [{"id": "sim-model", "object": "model"}]}).encode())
        else:
            self.answer(404, b'{"detail": "Not Found"}')

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        words = f"replica crashy/127.0.0.1:{port} at {address} (127.0.0.1:{port}) failed"
        status = 400 if body.get("max_tokens") == 400 else 500
        error = {"object": "error", "message": words, "type": "BadRequestError", "param": None, "code": status}
        self.answer(status, json.dumps(error).encode())

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def start_failing_replica(log_dir: Any) -> RunningProcess:
    port = free_port()
    command = [sys.executable, "-c", _FAILING_REPLICA, str(port)]
    return start_process(command, port=port, log_dir=log_dir, ready_path="/ready", timeout=30, name="crashy")


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    proc = start_replica(tmp_path_factory.mktemp("clean-replica"), "--time-scale", "0.02")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def gateway(replica: RunningProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    proc = start_gateway(gateway_config([replica.url]), tmp_path_factory.mktemp("clean-gateway"))
    yield proc
    proc.stop()


def strict(call: Any) -> Any:
    """Run ``call`` with every warning an error, and serialise what it returns as clients do (pydantic warns only
    then, for a field whose value is not of the type OpenAI's schema gives it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = call()
        for item in result if isinstance(result, list) else [result]:
            item.model_dump()
            item.to_json()
        return result


# The SDK, without a warning -------------------------------------------------------------------------------------


def test_whole_and_streamed_answers_serialise_in_the_sdk_without_a_warning(gateway: RunningProcess) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    chat = strict(lambda: client.chat.completions.create(model="chat", messages=HELLO, max_tokens=6))
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 6
    chunks = strict(
        lambda: list(
            client.chat.completions.create(
                model="chat", messages=HELLO, max_tokens=6, stream=True, stream_options={"include_usage": True}
            )
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    text = strict(lambda: client.completions.create(model="chat", prompt="Once upon a time", max_tokens=6))
    assert text.choices[0].text
    pieces = strict(lambda: list(client.completions.create(model="chat", prompt="Once", max_tokens=6, stream=True)))
    assert "".join(p.choices[0].text for p in pieces if p.choices).strip()


def test_sglang_metadata_keeps_only_what_fits_openai_schema(gateway: RunningProcess, replica: RunningProcess) -> None:
    body = {"model": "chat", "messages": HELLO, "max_tokens": 3}
    direct = httpx.post(replica.url + "/v1/chat/completions", json={**body, "model": "sim-model"}, timeout=30).json()
    assert isinstance(direct["metadata"]["weight_versions"], list), "the simulated replica sends SGLang's metadata"
    relayed = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30).json()
    assert relayed["metadata"] == {"weight_version": direct["metadata"]["weight_version"]}
    # What the gateway removes is what makes the SDK warn: the replica's own answer, read straight.
    straight = openai.OpenAI(base_url=replica.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(UserWarning, match="metadata"):
        strict(lambda: straight.chat.completions.create(model="sim-model", messages=HELLO, max_tokens=3))


# Paths without /v1 -----------------------------------------------------------------------------------------------


def test_paths_without_v1_are_served_as_with_it(gateway: RunningProcess, replica: RunningProcess) -> None:
    bare = openai.OpenAI(base_url=gateway.url, api_key=TENANT_KEY, max_retries=0)
    raw = bare.chat.completions.with_raw_response.create(model="chat", messages=HELLO, max_tokens=4)
    assert raw.http_response.url.path == "/chat/completions"
    assert raw.parse().usage.completion_tokens == 4 and raw.headers["x-spillgate-backend"] == replica_name(replica)
    streamed = list(bare.chat.completions.create(model="chat", messages=HELLO, max_tokens=4, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices).strip()
    assert bare.completions.create(model="chat", prompt="Once upon a time", max_tokens=4).usage.completion_tokens == 4
    with_v1 = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    assert [m.id for m in bare.models.list()] == [m.id for m in with_v1.models.list()]
    assert bare.models.retrieve("chat").id == "chat"
    with pytest.raises(openai.NotFoundError) as missing:
        bare.models.retrieve("no-such-model")
    assert missing.value.code == "model_not_found"
    slash = httpx.post(
        gateway.url + "/completions/", json={"model": "chat", "prompt": "x", "max_tokens": 2}, headers=AUTH
    )
    assert slash.status_code == 200, slash.text


# Unknown paths and wrong methods ------------------------------------------------------------------------------------


def error_of(response: httpx.Response) -> dict[str, Any]:
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize(("method", "path"), [("GET", "/no-such-page"), ("POST", "/v1/chat"), ("GET", "/v2/models")])
def test_an_unknown_path_is_a_404_that_lists_what_is_served(gateway: RunningProcess, method: str, path: str) -> None:
    response = httpx.request(method, gateway.url + path, headers=AUTH, json={})
    assert response.status_code == 404
    error = error_of(response)
    assert error["code"] == "unsupported_endpoint" and error["type"] == "not_found_error"
    assert f"{method} {path}" in error["message"]
    for served in ("POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models"):
        assert served in error["message"]


@pytest.mark.parametrize("path", ["/v1/moderations", "/moderations", "/v1/audio/speech", "/v1/images/generations"])
def test_known_apis_not_served_say_so(gateway: RunningProcess, path: str) -> None:
    response = httpx.post(gateway.url + path, headers=AUTH, json={"model": "chat", "input": "hi"})
    assert response.status_code == 404
    error = error_of(response)
    assert error["code"] == "unsupported_endpoint"
    assert "not supported by this gateway yet" in error["message"] and "POST /v1/chat/completions" in error["message"]


def test_the_sdk_reads_an_unsupported_endpoint_as_not_found(gateway: RunningProcess) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as refused:
        client.moderations.create(model="chat", input="hi")
    assert refused.value.code == "unsupported_endpoint"
    assert "moderations" in refused.value.message


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/chat/completions", "POST"),
        ("PUT", "/completions", "POST"),
        ("POST", "/v1/models", "GET"),
        ("DELETE", "/models/chat", "GET"),
        ("POST", "/health", "GET, HEAD"),
    ],
)
def test_a_wrong_method_is_a_405_with_allow(gateway: RunningProcess, method: str, path: str, allow: str) -> None:
    response = httpx.request(method, gateway.url + path, headers=AUTH)
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    error = error_of(response)
    assert (
        error["code"] == "method_not_allowed" and method in error["message"] and allow.split(",")[0] in error["message"]
    )


# Errors that name no replica ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def failing_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningProcess, list[str]]]:
    """A gateway over a replica that answers 500 (pool ``crashy``) and one that is stopped once the gateway has
    seen it healthy (pool ``gone``), probed rarely enough that the gateway still believes in it; with the addresses
    and names no error may show."""
    log_dir = tmp_path_factory.mktemp("clean-failing")
    crashy = start_failing_replica(log_dir)
    gone = start_replica(log_dir, "--time-scale", "0.02")
    config = gateway_config([])
    config["pools"] = [
        {"name": "crashy", "served_model": "sim-model", "replicas": [crashy.url]},
        {"name": "gone", "served_model": "sim-model", "replicas": [gone.url]},
    ]
    config["routes"] = [{"name": "crashy", "targets": ["crashy"]}, {"name": "gone", "targets": ["gone"]}]
    config["tenants"] = [{"name": "tenant-a", "keys": [TENANT_KEY]}]
    config["health"] = {"interval_s": 300, "timeout_s": 5, "unhealthy_after": 3}
    config["outlier"] = {"consecutive_failures": 100}
    proc = start_gateway(config, log_dir)
    try:
        names = [replica_name(crashy, "crashy"), replica_name(gone, "gone")]
        wait_healthy(proc, set(names))
        gone.stop()
        hidden = []
        for replica in (crashy, gone):
            host_port = replica.url.split("://", 1)[1]
            hidden += [replica.url, host_port, host_port.rsplit(":", 1)[1]]
        yield proc, [*hidden, *names, "127.0.0.1"]
    finally:
        proc.stop()
        crashy.stop()
        gone.stop()


def wait_healthy(gateway: RunningProcess, names: set[str]) -> None:
    for _ in range(300):
        backends = httpx.get(gateway.url + "/health", timeout=10).json()["backends"]
        if all(backends.get(name, {}).get("healthy") for name in names):
            return
        time.sleep(0.1)
    raise AssertionError(f"{names} never became healthy: {backends}")


def assert_names_nothing(text: str, hidden: list[str]) -> None:
    for secret in hidden:
        assert secret not in text, f"{secret!r} reached the tenant: {text}"


@pytest.mark.parametrize("stream", [False, True])
def test_a_replica_answering_500_is_a_502_that_names_no_replica(
    failing_gateway: tuple[RunningProcess, list[str]], stream: bool
) -> None:
    gateway, hidden = failing_gateway
    body = {"model": "crashy", "messages": HELLO, "max_tokens": 4, "stream": stream}
    response = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 502
    assert error_of(response)["code"] == "backend_error"
    assert_names_nothing(response.text, hidden)


def test_a_replica_refusal_that_repeats_its_address_is_relayed_without_it(
    failing_gateway: tuple[RunningProcess, list[str]],
) -> None:
    gateway, hidden = failing_gateway
    body = {"model": "crashy", "messages": HELLO, "max_tokens": 400}
    response = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 400
    error = error_of(response)
    assert error["message"].startswith("replica the backend at the backend"), error["message"]
    assert_names_nothing(response.text, hidden)


def test_a_replica_that_refuses_connections_is_a_502_that_names_no_replica(
    failing_gateway: tuple[RunningProcess, list[str]],
) -> None:
    gateway, hidden = failing_gateway
    body = {"model": "gone", "messages": HELLO, "max_tokens": 4}
    response = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 502, response.text
    assert error_of(response)["code"] in ("backend_connect", "backend_protocol")
    assert_names_nothing(response.text, hidden)
    assert orjson.loads(response.content)["error"]["message"].startswith("The backend")
