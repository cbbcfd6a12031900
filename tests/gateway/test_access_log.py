"""The access log: one line per request on the gateway's output, whatever the endpoint and however it ended.

A real gateway process over a simulated replica and two lying ones (:mod:`tests.gateway.lying_replica`); each
request carries its own ``x-request-id`` so its line can be found in the process's output.
"""

from __future__ import annotations

import copy
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.support.gateway import (
    OTHER_KEY,
    TENANT_KEY,
    gateway_config,
    pool_of,
    start_gateway,
    start_lying_replica,
    start_replica,
)
from tests.support.procs import RunningProcess

ADMIN_KEY = "sk-test-admin-0123"
WRONG_KEY = "sk-wrong-SECRET-4711"
HELLO = [{"role": "user", "content": "hello there"}]
CHAT = "/v1/chat/completions"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
FIELDS = {
    "time",
    "request_id",
    "trace_id",
    "method",
    "path",
    "status",
    "error_code",
    "tenant",
    "route",
    "backend",
    "reason",
    "outcome",
    "stream",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "ttft_ms",
    "duration_ms",
    "cost_usd",
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    log_dir = tmp_path_factory.mktemp("access-log")
    good = start_replica(log_dir, "--time-scale", "0.02")
    liars = [start_lying_replica(log_dir, "garbage"), start_lying_replica(log_dir, "hang")]
    config = gateway_config([good.url])
    config["pools"] += [
        {"name": "solo", "served_model": "sim-model", "replicas": [liars[0].url]},
        {"name": "hung", "served_model": "sim-model", "replicas": [liars[1].url]},
    ]
    config["routes"] += [{"name": "broken", "targets": ["solo"]}, {"name": "silent", "targets": ["hung"]}]
    config["tenants"][0]["routes"] = ["*"]
    config["admin"] = {"keys": [ADMIN_KEY]}
    proc = start_gateway(config, log_dir)
    try:
        yield proc
    finally:
        proc.stop()
        for liar in liars:
            liar.stop()
        good.stop()


def new_id() -> str:
    return f"req-{uuid.uuid4().hex}"


def auth(key: str = TENANT_KEY, request_id: str = "", **extra: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", "x-request-id": request_id, **extra}


def json_lines(gateway: RunningProcess) -> list[dict[str, Any]]:
    found = []
    for text in gateway.log().splitlines():
        if text.startswith("{") and '"request_id"' in text:
            found.append(orjson.loads(text))
    return found


_LOGFMT_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)')


def logfmt_lines(gateway: RunningProcess) -> list[dict[str, Any]]:
    found = []
    for text in gateway.log().splitlines():
        if text.startswith("time=") and " request_id=" in text:
            pairs = _LOGFMT_PAIR.findall(text)
            found.append({key: orjson.loads(value) if value.startswith('"') else value for key, value in pairs})
    return found


def line_of(gateway: RunningProcess, request_id: str, *, parse: Any = json_lines) -> dict[str, Any]:
    """The one line of the request with ``request_id``, once the writer has written it."""
    deadline = time.monotonic() + 10
    while True:
        lines = [line for line in parse(gateway) if line["request_id"] == request_id]
        if lines:
            break
        assert time.monotonic() < deadline, f"no access-log line for {request_id}:\n{gateway.log()[-3000:]}"
        time.sleep(0.05)
    time.sleep(0.2)  # a second line would have been written by now
    lines = [line for line in parse(gateway) if line["request_id"] == request_id]
    assert len(lines) == 1, lines
    return lines[0]


def sdk(gateway: RunningProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)


def test_a_whole_answer_leaves_one_line_with_its_tokens_and_timings(gateway: RunningProcess) -> None:
    request_id = new_id()
    answer = sdk(gateway).chat.completions.create(
        model="chat", messages=HELLO, max_tokens=5, extra_headers={"x-request-id": request_id}
    )
    line = line_of(gateway, request_id)
    assert set(line) == FIELDS
    assert answer.usage is not None
    assert line["method"] == "POST" and line["path"] == CHAT
    assert (line["status"], line["error_code"], line["outcome"]) == (200, "", "ok")
    assert (line["tenant"], line["route"], pool_of(line["backend"])) == ("tenant-a", "chat", "pool")
    assert line["reason"] == "least_load"
    assert line["stream"] is False
    assert line["prompt_tokens"] == answer.usage.prompt_tokens
    assert line["output_tokens"] == answer.usage.completion_tokens
    assert isinstance(line["cached_tokens"], int)
    assert 0 < line["ttft_ms"] <= line["duration_ms"]
    assert line["cost_usd"] == 0.0  # a pool without gpu_usd_per_hour costs nothing
    assert line["trace_id"] == ""
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"])


def test_a_stream_is_logged_when_it_ends(gateway: RunningProcess) -> None:
    request_id = new_id()
    chunks = sdk(gateway).chat.completions.create(
        model="chat",
        messages=HELLO,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-request-id": request_id},
    )
    usage = [chunk.usage for chunk in chunks if chunk.usage is not None][-1]
    line = line_of(gateway, request_id)
    assert (line["status"], line["outcome"], line["stream"]) == (200, "ok", True)
    assert line["output_tokens"] == usage.completion_tokens
    assert line["prompt_tokens"] == usage.prompt_tokens
    assert 0 < line["ttft_ms"] <= line["duration_ms"]


def test_a_stream_without_usage_asked_still_logs_its_tokens(gateway: RunningProcess) -> None:
    request_id = new_id()
    body = {"model": "chat", "messages": HELLO, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", gateway.url + CHAT, json=body, headers=auth(request_id=request_id)) as response:
        text = b"".join(response.iter_bytes())
    assert b'"usage"' not in text
    line = line_of(gateway, request_id)
    assert isinstance(line["output_tokens"], int) and line["output_tokens"] > 0


@pytest.mark.parametrize(
    ("method", "body", "key", "status", "code", "tenant"),
    [
        ("POST", {"model": "chat", "messages": HELLO}, WRONG_KEY, 401, "invalid_api_key", ""),
        ("POST", {"model": "broken", "messages": HELLO}, OTHER_KEY, 403, "model_not_allowed", "tenant-b"),
        ("POST", {"model": "no-such-model", "messages": HELLO}, TENANT_KEY, 404, "model_not_found", "tenant-a"),
        ("POST", {"model": "chat", "messages": "hi"}, TENANT_KEY, 422, None, "tenant-a"),
        ("POST", b"{not json", TENANT_KEY, 400, "invalid_json", "tenant-a"),
        ("GET", None, TENANT_KEY, 405, "method_not_allowed", ""),
    ],
)
def test_each_refusal_leaves_one_line_with_its_status_and_code(
    gateway: RunningProcess, method: str, body: Any, key: str, status: int, code: str | None, tenant: str
) -> None:
    request_id = new_id()
    content = body if isinstance(body, bytes) else None
    payload = None if isinstance(body, bytes) else body
    response = httpx.request(
        method, gateway.url + CHAT, json=payload, content=content, headers=auth(key, request_id), timeout=30
    )
    assert response.status_code == status, response.text
    line = line_of(gateway, request_id)
    assert line["status"] == status
    assert line["error_code"] == (response.json()["error"]["code"] or "")
    if code is not None:
        assert line["error_code"] == code
    assert line["outcome"] == "refused"
    assert line["backend"] == "" and line["output_tokens"] is None
    if status != 405:  # a wrong method is refused before the key is read
        assert line["tenant"] == tenant
    assert WRONG_KEY not in gateway.log() and TENANT_KEY not in gateway.log()


def test_a_backend_failure_is_logged_as_the_502_the_client_got(gateway: RunningProcess) -> None:
    request_id = new_id()
    body = {"model": "broken", "messages": HELLO, "max_tokens": 4}
    response = httpx.post(gateway.url + CHAT, json=body, headers=auth(request_id=request_id), timeout=30)
    assert response.status_code == 502
    line = line_of(gateway, request_id)
    assert (line["status"], line["error_code"]) == (502, "backend_invalid_response")
    assert (line["route"], pool_of(line["backend"]), line["outcome"]) == ("broken", "solo", "error")


def test_a_client_that_leaves_before_any_answer_is_logged_when_it_goes(gateway: RunningProcess) -> None:
    request_id = new_id()
    body = {"model": "silent", "messages": HELLO, "max_tokens": 4, "stream": True}
    timeout = httpx.Timeout(5, read=0.3)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(gateway.url + CHAT, json=body, headers=auth(request_id=request_id), timeout=timeout)
    line = line_of(gateway, request_id)
    assert (line["status"], line["outcome"], pool_of(line["backend"])) == (499, "client_disconnected", "hung")
    assert line["duration_ms"] >= 200  # the client waited 0.3 s from sending; the gateway's clock starts later


def test_the_clients_trace_id_is_logged(gateway: RunningProcess) -> None:
    request_id = new_id()
    body = {"model": "chat", "messages": HELLO, "max_tokens": 2}
    headers = auth(request_id=request_id, traceparent=TRACEPARENT)
    assert httpx.post(gateway.url + CHAT, json=body, headers=headers, timeout=30).status_code == 200
    assert line_of(gateway, request_id)["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    ("path", "key", "status", "code", "tenant"),
    [
        ("/v1/models", TENANT_KEY, 200, "", "tenant-a"),
        ("/v1/models/no-such-model", TENANT_KEY, 404, "model_not_found", "tenant-a"),
        ("/v1/models", WRONG_KEY, 401, "invalid_api_key", ""),
        ("/admin/config", TENANT_KEY, 403, "admin_key_required", "tenant-a"),
        ("/admin/config", ADMIN_KEY, 200, "", "admin"),
        ("/no/such/path", TENANT_KEY, 404, "unsupported_endpoint", "tenant-a"),
    ],
)
def test_every_other_endpoint_is_logged_too(
    gateway: RunningProcess, path: str, key: str, status: int, code: str, tenant: str
) -> None:
    request_id = new_id()
    response = httpx.get(gateway.url + path, headers=auth(key, request_id), timeout=30)
    assert response.status_code == status
    line = line_of(gateway, request_id)
    assert (line["method"], line["path"], line["status"]) == ("GET", path, status)
    assert (line["error_code"], line["tenant"]) == (code, tenant)
    assert ADMIN_KEY not in gateway.log()


def test_format_and_prompt_follow_a_live_config_edit(gateway: RunningProcess) -> None:
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    original = httpx.get(gateway.url + "/admin/config", headers=admin).json()["config"]
    secret_prompt = [{"role": "user", "content": 'say "hi" = now'}]
    try:
        edited = copy.deepcopy(original)
        edited["logging"] = {"format": "logfmt", "include_prompt": True}
        assert httpx.put(gateway.url + "/admin/config", json=edited, headers=admin, timeout=30).status_code == 200
        request_id = new_id()
        body = {"model": "chat", "messages": secret_prompt, "max_tokens": 2}
        assert httpx.post(gateway.url + CHAT, json=body, headers=auth(request_id=request_id)).status_code == 200
        line = line_of(gateway, request_id, parse=logfmt_lines)
        assert (line["status"], line["tenant"], line["stream"]) == ("200", "tenant-a", "false")
        assert orjson.loads(line["prompt"]) == secret_prompt

        edited["logging"] = {"access_log": False}
        assert httpx.put(gateway.url + "/admin/config", json=edited, headers=admin, timeout=30).status_code == 200
        quiet = new_id()
        assert httpx.post(gateway.url + CHAT, json=body, headers=auth(request_id=quiet)).status_code == 200
        time.sleep(0.5)
        assert quiet not in gateway.log()
    finally:
        restored = httpx.put(gateway.url + "/admin/config", json=original, headers=admin, timeout=30)
        assert restored.status_code == 200, restored.text


def test_the_prompt_is_not_logged_by_default(gateway: RunningProcess) -> None:
    request_id = new_id()
    marker = f"private-{uuid.uuid4().hex}"
    body = {"model": "chat", "messages": [{"role": "user", "content": marker}], "max_tokens": 2}
    assert httpx.post(gateway.url + CHAT, json=body, headers=auth(request_id=request_id)).status_code == 200
    assert "prompt" not in line_of(gateway, request_id)
    assert marker not in gateway.log()
