"""Bad input and broken backends get the right status and OpenAI's error body, never a 500."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.gateway import OTHER_KEY, TENANT_KEY, gateway_config, replica_name, start_gateway, start_replica
from tests.support.procs import RunningProcess, free_port

AUTH = {"authorization": f"Bearer {TENANT_KEY}"}
HELLO = [{"role": "user", "content": "hello"}]


def post(
    gateway: RunningProcess,
    payload: object = None,
    *,
    content: bytes | None = None,
    headers: dict[str, str] | None = None,
    path: str = "/v1/chat/completions",
) -> httpx.Response:
    return httpx.post(
        gateway.url + path,
        json=payload if content is None else None,
        content=content,
        headers=headers if headers is not None else AUTH,
        timeout=30,
    )


def assert_openai_error(response: httpx.Response, status: int, *, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize(
    ("payload", "status", "param"),
    [
        ({"model": "chat"}, 422, "messages"),
        ({"model": "chat", "messages": []}, 422, "messages"),
        ({"model": "chat", "messages": "hi"}, 422, "messages"),
        ({"model": "chat", "messages": [{"role": "robot", "content": "x"}]}, 422, "messages[0].role"),
        ({"model": "chat", "messages": [{"role": "user", "content": 7}]}, 422, "messages[0].content"),
        ({"model": "chat", "messages": HELLO, "stream": "yes"}, 422, "stream"),
        ({"model": "chat", "messages": HELLO, "max_tokens": -3}, 422, "max_tokens"),
        ({"model": "chat", "messages": HELLO, "max_tokens": 10**9}, 422, "max_tokens"),
        ({"model": "chat", "messages": HELLO, "temperature": "hot"}, 422, "temperature"),
        ({"model": "chat", "messages": HELLO, "response_format": "json"}, 422, "response_format"),
        ({"model": "chat", "messages": HELLO, "stream_options": {"include_usage": True}}, 422, "stream_options"),
        (
            {"model": "chat", "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            422,
            "messages[0].content[0].text",
        ),
        ({"model": "chat", "messages": HELLO, "response_format": {"type": "xml"}}, 422, "response_format"),
        (
            {"model": "chat", "messages": HELLO, "response_format": {"type": "json_schema"}},
            422,
            "response_format.json_schema",
        ),
        ({"model": 5, "messages": HELLO}, 422, "model"),
        ({"model": "no-such-model", "messages": HELLO}, 404, "model"),
        ([1, 2, 3], 400, None),
    ],
)
def test_invalid_requests(gateway: RunningProcess, payload: object, status: int, param: str | None) -> None:
    assert_openai_error(post(gateway, payload), status, param=param)


def test_completions_need_a_prompt(gateway: RunningProcess) -> None:
    assert_openai_error(post(gateway, {"model": "chat"}, path="/v1/completions"), 422, param="prompt")
    assert_openai_error(post(gateway, {"model": "chat", "prompt": [1.5]}, path="/v1/completions"), 422, param="prompt")


def test_a_replica_refusal_reaches_the_client_with_its_reason(gateway: RunningProcess) -> None:
    # SGLang writes its errors flat ({"object": "error", "message": ...}): rewrapped, the reason is kept.
    before = httpx.get(gateway.url + "/v1/spend", headers=AUTH, timeout=10).json()["today"]
    named = {"type": "function", "function": {"name": "missing"}}  # a tool the request does not offer
    error = assert_openai_error(
        post(gateway, {"model": "chat", "messages": HELLO, "max_tokens": 2, "tools": [], "tool_choice": named}), 400
    )
    assert "Tools cannot be empty" in error["message"], "the engine's reason is kept"
    assert "pool/" not in error["message"], "replica names stay in the gateway's log"
    # Booked (it reached a backend), with none of its prompt: the replica processed none of it.
    deadline = time.monotonic() + 10
    while (today := httpx.get(gateway.url + "/v1/spend", headers=AUTH, timeout=10).json()["today"])[
        "requests"
    ] == before["requests"]:
        assert time.monotonic() < deadline, "the refused request was never booked"
        time.sleep(0.1)
    assert today["requests"] == before["requests"] + 1 and today["prompt_tokens"] == before["prompt_tokens"]


def test_malformed_json(gateway: RunningProcess) -> None:
    error = assert_openai_error(post(gateway, content=b'{"model": "chat", "messages": ['), 400)
    assert error["code"] == "invalid_json"


def test_oversized_body_is_413(gateway: RunningProcess) -> None:
    big = [{"role": "user", "content": "x" * (5 * 1024 * 1024)}]
    assert_openai_error(post(gateway, {"model": "chat", "messages": big}), 413)


def test_keys_and_route_permissions(gateway: RunningProcess) -> None:
    body = {"model": "chat", "messages": HELLO, "max_tokens": 1}
    assert_openai_error(post(gateway, body, headers={}), 401)
    assert_openai_error(post(gateway, body, headers={"authorization": "Bearer sk-wrong"}), 401)
    assert_openai_error(post(gateway, body, headers={"authorization": "Basic abc"}), 401)
    assert_openai_error(post(gateway, body, headers={"authorization": f"Bearer {OTHER_KEY}"}), 403, param="model")


def test_openai_client_raises_typed_errors(gateway: RunningProcess) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    assert client.models.retrieve("chat").id == "chat"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=HELLO)
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model="chat", messages=[])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gateway.url + "/v1", api_key="bad", max_retries=0).models.list()


def test_unknown_path_and_method(gateway: RunningProcess) -> None:
    assert_openai_error(httpx.get(gateway.url + "/v1/nothing-here"), 404)
    assert_openai_error(httpx.get(gateway.url + "/v1/chat/completions", headers=AUTH), 405)
    # Load balancers probe with HEAD.
    for path in ("/health", "/ready"):
        probe = httpx.head(gateway.url + path)
        assert probe.status_code == 200 and probe.content == b""


def test_dead_backend_is_502_then_503(tmp_path: Path) -> None:
    replica = start_replica(tmp_path, "--time-scale", "0.02")
    config = gateway_config([replica.url], health={"interval_s": 60, "timeout_s": 1, "unhealthy_after": 1})
    gateway = start_gateway(config, tmp_path)
    try:
        replica.stop()
        body = {"model": "chat", "messages": HELLO, "max_tokens": 1}
        error = assert_openai_error(post(gateway, body), 502)
        assert error["code"] == "backend_connect"
        # The failure took the replica out of rotation: now nothing can serve the route.
        response = post(gateway, body)
        assert_openai_error(response, 503)
        assert response.headers["retry-after"]
        assert httpx.get(gateway.url + "/ready").status_code == 503
        assert httpx.get(gateway.url + "/health").status_code == 200
    finally:
        gateway.stop()
        replica.stop()


def test_fallback_to_another_replica_when_one_is_down(tmp_path: Path) -> None:
    live = start_replica(tmp_path, "--time-scale", "0.02")
    dead_url = f"http://127.0.0.1:{free_port()}"
    config = gateway_config([dead_url, live.url], health={"interval_s": 60, "timeout_s": 1, "unhealthy_after": 5})
    gateway = start_gateway(config, tmp_path)
    try:
        reasons = set()
        for _ in range(4):
            response = post(gateway, {"model": "chat-rr", "messages": HELLO, "max_tokens": 1})
            assert response.status_code == 200, response.text
            assert response.headers["x-spillgate-backend"] == replica_name(live)
            reasons.add(response.headers["x-spillgate-reason"])
        assert "fallback" in reasons
    finally:
        gateway.stop()
        live.stop()


def test_slow_backend_is_504(tmp_path: Path) -> None:
    slow = start_replica(tmp_path, "--time-scale", "20")
    gateway = start_gateway(gateway_config([slow.url], timeouts={"connect_s": 1, "read_s": 0.5}), tmp_path)
    try:
        response = post(gateway, {"model": "chat", "messages": HELLO, "max_tokens": 200})
        error = assert_openai_error(response, 504)
        assert error["code"] == "backend_timeout"
    finally:
        gateway.stop()
        slow.stop()


def test_client_disconnect_frees_the_backend_request(tmp_path: Path) -> None:
    replica = start_replica(tmp_path, "--time-scale", "1")
    gateway = start_gateway(gateway_config([replica.url]), tmp_path)
    try:
        body = {"model": "chat", "messages": HELLO, "max_tokens": 5000, "stream": True}
        with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            assert running_requests(replica) == 1
        # 5000 tokens take the simulated 8B model about 40 s; the abort must come long before.
        deadline = time.monotonic() + 5
        while running_requests(replica) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert running_requests(replica) == 0
        metrics = httpx.get(gateway.url + "/metrics").text
        assert 'outcome="client_disconnected"' in metrics
    finally:
        gateway.stop()
        replica.stop()


def test_past_max_in_flight_new_requests_get_503_overloaded_at_once(tmp_path: Path) -> None:
    replica = start_replica(tmp_path, "--time-scale", "1")
    gateway = start_gateway(gateway_config([replica.url], limits={"max_in_flight": 2}), tmp_path)
    body = {"model": "chat", "messages": HELLO, "max_tokens": 5000, "stream": True}
    try:
        with (
            httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30) as one,
            httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30) as two,
        ):
            streaming = [stream.iter_lines() for stream in (one, two)]  # kept: a dropped iterator hangs up
            for lines in streaming:
                assert next(line for line in lines if line.startswith("data: "))
            refused = post(gateway, {"model": "chat", "messages": HELLO, "max_tokens": 2})
            assert assert_openai_error(refused, 503)["code"] == "overloaded"
            assert refused.headers["retry-after"] == "1"
        deadline = time.monotonic() + 5  # the two streams are gone: room again
        while (response := post(gateway, {"model": "chat", "messages": HELLO, "max_tokens": 2})).status_code == 503:
            assert time.monotonic() < deadline, response.text
            time.sleep(0.05)
        assert response.status_code == 200, response.text
        assert "spillgate_overloaded_total 1.0" in httpx.get(gateway.url + "/metrics").text
    finally:
        gateway.stop()
        replica.stop()


def running_requests(replica: RunningProcess) -> int:
    for line in httpx.get(replica.url + "/metrics").text.splitlines():
        if line.startswith("sglang:num_running_reqs"):
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError("sglang:num_running_reqs missing from the replica's /metrics")


def test_clients_cannot_set_internal_headers(gateway: RunningProcess) -> None:
    forged = {"x-spillgate-backend": "pool-2", "x-spillgate-reason": "overflow", "x-spillgate-tenant": "tenant-a"}
    as_b = {"authorization": f"Bearer {OTHER_KEY}", **forged}
    response = post(gateway, {"model": "chat", "messages": HELLO, "max_tokens": 2}, headers=as_b)
    assert response.status_code == 403, "the key decides the tenant, not a header"
    response = post(gateway, {"model": "chat", "messages": HELLO, "max_tokens": 2}, headers={**AUTH, **forged})
    assert response.status_code == 200
    assert response.headers["x-spillgate-reason"] == "least_load"
    assert len(response.headers.get_list("x-spillgate-backend")) == 1
