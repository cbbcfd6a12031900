"""Replicas that pass their probes but fail requests: ejected, fallen back from, never relayed as success.

Each lying replica is a real process (:mod:`tests.gateway.lying_replica`) next to a real simulated one.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support.gateway import (
    TENANT_KEY,
    gateway_config,
    replica_name,
    start_gateway,
    start_lying_replica,
    start_replica,
)
from tests.support.procs import RunningProcess

AUTH = {"authorization": f"Bearer {TENANT_KEY}"}
HELLO = [{"role": "user", "content": "hello"}]
THRESHOLD = 3
REPLICA_KEY = "replica-SECRET-77"


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningProcess]]:
    """A sound replica (``good``) and a lying one per mode."""
    log_dir = tmp_path_factory.mktemp("faulty-upstreams")
    started = {"good": start_replica(log_dir, "--time-scale", "0.02")}
    try:
        for mode in ("garbage", "broken_midstream", "hang", "echo_key"):
            started[mode] = start_lying_replica(log_dir, mode)
        yield started
    finally:
        for proc in started.values():
            proc.stop()


@pytest.fixture(scope="module")
def gateway(upstreams: dict[str, RunningProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    log_dir = tmp_path_factory.mktemp("faulty-replicas")
    good, liars = upstreams["good"], upstreams
    pools = {
        "mixed": [liars["garbage"].url, good.url],  # the first lies, the second is sound
        "hung": [liars["hang"].url, good.url],
        "solo": [liars["garbage"].url],
        "midstream": [liars["broken_midstream"].url],
        "keyed": [liars["echo_key"].url],
    }
    config = gateway_config([good.url])
    config["pools"] = [{"name": name, "served_model": "sim-model", "replicas": urls} for name, urls in pools.items()]
    config["pools"][-1]["api_key"] = REPLICA_KEY
    config["routes"] = [{"name": name, "targets": [name], "policy": "round_robin"} for name in pools]
    config["tenants"] = [{"name": "tenant-a", "keys": [TENANT_KEY]}]
    config["timeouts"] = {"connect_s": 1, "read_s": 1}  # the hung replica is given up on after a second
    config["outlier"] = {"consecutive_failures": THRESHOLD, "base_ejection_s": 120, "retry_backoff_s": 0.01}
    proc = start_gateway(config, log_dir)
    yield proc
    proc.stop()


def client(gateway: RunningProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)


def replica_health(gateway: RunningProcess, name: str) -> dict:
    return httpx.get(gateway.url + "/health", timeout=10).json()["backends"][name]


def ejections(gateway: RunningProcess, name: str) -> float:
    for line in httpx.get(gateway.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(f'spillgate_backend_ejections_total{{backend="{name}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def post(gateway: RunningProcess, route: str, *, stream: bool = False) -> httpx.Response:
    body = {"model": route, "messages": HELLO, "max_tokens": 2, "stream": stream}
    return httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)


def test_a_replica_answering_garbage_falls_back_and_is_ejected_while_its_probe_passes(
    gateway: RunningProcess, upstreams: dict[str, RunningProcess]
) -> None:
    liar, sound = replica_name(upstreams["garbage"], "mixed"), replica_name(upstreams["good"], "mixed")
    assert replica_health(gateway, liar)["healthy"], "the liar passes its probes"
    fallbacks = 0
    for i in range(12):
        response = post(gateway, "mixed", stream=i % 2 == 1)
        assert response.status_code == 200, response.text
        assert response.headers["x-spillgate-backend"] == sound, "garbage is never relayed as an answer"
        fallbacks += response.headers["x-spillgate-reason"] == "fallback"
        if i % 2:
            assert "not json" not in response.text and "data: [DONE]" in response.text
        else:
            assert response.json()["choices"]
    assert 1 <= fallbacks <= THRESHOLD, "after the threshold the liar is out of rotation: no more fallbacks"
    health = replica_health(gateway, liar)
    assert health["outlier"]["state"] == "ejected" and health["outlier"]["ejected"]
    assert not health["healthy"] and health["outlier"]["ejected_for_s"] > 60
    assert "invalid response" in health["outlier"]["last_failure"]
    assert replica_health(gateway, sound)["outlier"]["state"] == "closed"
    assert ejections(gateway, liar) == 1
    assert liar in gateway.log() and "ejected" in gateway.log(), "the operator learns which replica and why"


def test_a_replica_that_hangs_before_its_first_byte_is_fallen_back_from_and_ejected(
    gateway: RunningProcess, upstreams: dict[str, RunningProcess]
) -> None:
    sdk, hung = client(gateway), replica_name(upstreams["hang"], "hung")
    for i in range(THRESHOLD + 3):
        if i % 2:
            chunks = sdk.chat.completions.create(model="hung", messages=HELLO, max_tokens=2, stream=True)
            assert any(chunk.choices and chunk.choices[0].delta.content for chunk in chunks)
        else:
            answer = sdk.chat.completions.create(model="hung", messages=HELLO, max_tokens=2)
            assert answer.choices[0].message.content
    health = replica_health(gateway, hung)
    assert health["outlier"]["state"] == "ejected"
    assert "timeout" in health["outlier"]["last_failure"]
    assert ejections(gateway, hung) == 1


def test_an_invalid_answer_with_nowhere_else_to_go_is_a_502_never_a_200(
    gateway: RunningProcess, upstreams: dict[str, RunningProcess]
) -> None:
    sdk, solo = client(gateway), replica_name(upstreams["garbage"], "solo")
    for _ in range(THRESHOLD + 1):
        with pytest.raises(openai.InternalServerError) as whole:
            sdk.chat.completions.create(model="solo", messages=HELLO, max_tokens=2)
        assert whole.value.status_code == 502
        assert whole.value.body["code"] == "backend_invalid_response"
        assert solo not in whole.value.message and "upstream says hi" not in whole.value.message
        # A stream that is broken from its first event: nothing was sent yet, so a 502 too, not a 200.
        response = post(gateway, "solo", stream=True)
        assert response.status_code == 502 and response.headers["content-type"].startswith("application/json")
        assert response.json()["error"]["code"] == "backend_invalid_response"
    # A pool's only replica is not ejected (there is nowhere else to send its requests), but it is recorded.
    health = replica_health(gateway, solo)
    assert health["outlier"]["state"] == "closed" and health["outlier"]["consecutive_failures"] > THRESHOLD
    assert solo in gateway.log() and "invalid response" in gateway.log()


def test_an_invalid_event_mid_stream_ends_the_stream_with_an_error_event(
    gateway: RunningProcess, upstreams: dict[str, RunningProcess]
) -> None:
    response = post(gateway, "midstream", stream=True)
    assert response.status_code == 200
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert '"content":"ok"' in events[0]
    assert events[-1].startswith('{"error":') and "backend_invalid_response" in events[-1]
    assert "not json" not in response.text and "[DONE]" not in response.text
    assert replica_name(upstreams["broken_midstream"], "midstream") not in response.text
    with pytest.raises(openai.APIError):
        list(client(gateway).chat.completions.create(model="midstream", messages=HELLO, max_tokens=2, stream=True))


def test_a_replica_refusal_reaches_the_tenant_without_secrets_or_replica_names(
    gateway: RunningProcess, upstreams: dict[str, RunningProcess]
) -> None:
    keyed = replica_name(upstreams["echo_key"], "keyed")
    with pytest.raises(openai.BadRequestError) as refused:
        client(gateway).chat.completions.create(model="keyed", messages=HELLO, max_tokens=2)
    message = refused.value.body["message"]
    assert message.startswith("bad request; your key was"), "the engine's reason is kept"
    assert REPLICA_KEY not in message and "[redacted]" in message
    assert keyed not in message and "pool" not in message
    raw = post(gateway, "keyed")
    assert raw.status_code == 400 and REPLICA_KEY not in raw.text and keyed not in raw.text
    assert replica_health(gateway, keyed)["outlier"]["consecutive_failures"] == 0, "a refusal is an answer"
