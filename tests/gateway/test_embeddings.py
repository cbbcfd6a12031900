"""``POST /v1/embeddings`` through a real gateway: the official openai SDK over simulated replicas with
``task: embed`` and a hosted embeddings model (a small OpenAI-compatible recorder), load balancing, spend, metrics,
and requests to a route of the other task."""

from __future__ import annotations

import base64
import json
import math
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from spillgate.backends.sim.tokenizer import Tokenizer
from tests.support.gateway import TENANT_KEY, gateway_config, start_gateway, start_replica
from tests.support.procs import RunningProcess

AUTH = {"authorization": f"Bearer {TENANT_KEY}"}
ADMIN_KEY = "sk-embeddings-admin"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
PROVIDER_KEY = "sk-embedding-provider-77"
HOSTED_USD_PER_MTOK = 0.5
HIDDEN_SIZE = 4096
RECORDER_SIZE = 3
FAILURES = {"provider-breaks": (500, "internal trouble"), "provider-refuses": (400, "this input is not allowed")}
"""Inputs the recorder answers with an error: status and message."""


class Recorder(ThreadingHTTPServer):
    """An OpenAI-compatible embeddings provider: a vector of ``RECORDER_SIZE`` per input, one prompt token per
    word; keeps every request it was sent."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _RecorderHandler)
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class _RecorderHandler(BaseHTTPRequestHandler):
    server: Recorder

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if isinstance(inputs[0], str) and inputs[0] in FAILURES:
            status, message = FAILURES[inputs[0]]
            self._send(status, {"error": {"message": message, "type": "invalid_request_error", "code": None}})
            return
        data = []
        for index in range(len(inputs)):
            vector = [float(index + 1), 0.5, -0.25]
            embedding: Any = vector
            if body.get("encoding_format") == "base64":
                embedding = base64.b64encode(struct.pack("<3f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        words = sum(len(str(text).split()) for text in inputs)
        answer = {
            "object": "list",
            "data": data,
            "model": body["model"],
            "usage": {"prompt_tokens": words, "total_tokens": words},
        }
        self._send(200, answer)

    def _send(self, status: int, answer: dict[str, Any]) -> None:
        raw = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.fixture(scope="module")
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, recorder: Recorder) -> Iterator[RunningProcess]:
    """Two embedding replicas (an embedding of a long input takes a while there), one generation replica, and the
    recorder as a hosted embeddings model."""
    log_dir = tmp_path_factory.mktemp("embeddings")
    embedders = [start_replica(log_dir, "--time-scale", "10") for _ in range(2)]
    generator = start_replica(log_dir, "--time-scale", "0.05")
    try:
        config = gateway_config([generator.url])
        config["pools"].append(
            {
                "name": "embedder",
                "served_model": "sim-model",
                "replicas": [r.url for r in embedders],
                "task": "embed",
                "gpu_usd_per_hour": 3.6,
            }
        )
        config["hosted_models"] = [
            {
                "name": "provider",
                "model": "openai/text-embed-sim",
                "api_base": recorder.url + "/v1",
                "api_key": PROVIDER_KEY,
                "task": "embed",
                "input_per_mtok": HOSTED_USD_PER_MTOK,
                "timeout_s": 5,
            }
        ]
        config["routes"] += [
            {"name": "embed", "targets": ["embedder"], "policy": "least_load", "aliases": ["embed-alias"]},
            {"name": "embed-rr", "targets": ["embedder"], "policy": "round_robin"},
            {"name": "embed-cache", "targets": ["embedder"], "policy": "cache_aware"},
            {"name": "embed-hash", "targets": ["embedder"], "policy": "consistent_hash"},
            {"name": "embed-hosted", "targets": ["provider"]},
        ]
        config["health"]["generation_check_s"] = 0
        config["admin"] = {"keys": [ADMIN_KEY]}
        gateway = start_gateway(config, log_dir)
        try:
            yield gateway
        finally:
            gateway.stop()
    finally:
        for replica in [*embedders, generator]:
            replica.stop()


def client(gateway: RunningProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)


def tokens(text: str) -> int:
    return len(Tokenizer().encode(text)) + 1  # and the BOS token


def spend_today(gateway: RunningProcess) -> dict[str, Any]:
    return httpx.get(gateway.url + "/v1/spend", headers=AUTH, timeout=10).json()["today"]


def samples(gateway: RunningProcess, name: str) -> dict[frozenset[tuple[str, str]], float]:
    page = httpx.get(gateway.url + "/metrics", timeout=10).text
    return {
        frozenset(sample.labels.items()): sample.value
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if sample.name == name
    }


def total(found: dict[frozenset[tuple[str, str]], float], **labels: str) -> float:
    wanted = set(labels.items())
    return sum(value for key, value in found.items() if wanted <= key)


def eventually(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_the_sdk_gets_float_and_base64_embeddings_of_a_list_with_usage(gateway: RunningProcess) -> None:
    texts = ["a model in the cache", "the route of a query", "spill"]
    sdk = client(gateway)
    floats = sdk.embeddings.create(model="embed", input=texts, encoding_format="float")
    assert [item.index for item in floats.data] == [0, 1, 2]
    assert all(len(item.embedding) == HIDDEN_SIZE for item in floats.data)
    assert math.isclose(math.fsum(x * x for x in floats.data[0].embedding), 1.0, rel_tol=1e-9)
    assert floats.usage.prompt_tokens == sum(tokens(t) for t in texts) == floats.usage.total_tokens
    raw = sdk.embeddings.create(model="embed", input=texts, encoding_format="base64")
    assert isinstance(raw.data[1].embedding, str)
    decoded = struct.unpack(f"<{HIDDEN_SIZE}f", base64.b64decode(raw.data[1].embedding))
    assert decoded == pytest.approx(floats.data[1].embedding, abs=1e-6)
    # The SDK's default: it asks for base64 and decodes it. Through an alias too.
    default = sdk.embeddings.create(model="embed-alias", input="spill")
    assert default.data[0].embedding == pytest.approx(floats.data[2].embedding, abs=1e-6)


def test_token_ids_and_dimensions_reach_the_replica(gateway: RunningProcess) -> None:
    sdk = client(gateway)
    answer = sdk.embeddings.create(model="embed", input=[[1, 2, 3], [4, 5]], dimensions=16, encoding_format="float")
    assert [len(item.embedding) for item in answer.data] == [16, 16]
    assert answer.usage.prompt_tokens == 5


def test_replicas_embeddings_are_booked_in_spend_and_metrics(gateway: RunningProcess) -> None:
    before = spend_today(gateway)
    requests_before = samples(gateway, "spillgate_requests_total")
    prompt_before = samples(gateway, "spillgate_prompt_tokens_total")
    spend_metric_before = samples(gateway, "spillgate_spend_usd_total")
    text = "the layer of a batch " * 20
    raw = client(gateway).embeddings.with_raw_response.create(model="embed", input=text, encoding_format="float")
    backend = raw.headers["x-spillgate-backend"]
    usage = raw.parse().usage
    assert usage.prompt_tokens == tokens(text)
    eventually(lambda: spend_today(gateway)["requests"] == before["requests"] + 1, "the request was never booked")
    today = spend_today(gateway)
    assert today["prompt_tokens"] - before["prompt_tokens"] == usage.prompt_tokens
    assert today["usd"] > before["usd"], "the replica's GPU time is rent"
    requests = samples(gateway, "spillgate_requests_total")
    ok = {"route": "embed", "backend": backend, "outcome": "ok"}
    assert total(requests, **ok) == total(requests_before, **ok) + 1
    prompt = samples(gateway, "spillgate_prompt_tokens_total")
    kind = {"backend": backend, "kind": "prompt"}
    assert total(prompt, **kind) - total(prompt_before, **kind) == usage.prompt_tokens
    spent = samples(gateway, "spillgate_spend_usd_total")
    assert total(spent, route="embed", backend=backend) > total(spend_metric_before, route="embed", backend=backend)


def test_a_hosted_embeddings_model_is_reached_through_litellm_and_priced_at_its_input_price(
    gateway: RunningProcess, recorder: Recorder
) -> None:
    before = spend_today(gateway)
    metric_before = total(samples(gateway, "spillgate_spend_usd_total"), route="embed-hosted", kind="hosted")
    sent = len(recorder.requests)
    sdk = client(gateway)
    answer = sdk.embeddings.create(
        model="embed-hosted", input=["one two three", "four five"], encoding_format="float", user="end-user-9"
    )
    assert [item.embedding for item in answer.data] == [[1.0, 0.5, -0.25], [2.0, 0.5, -0.25]]
    assert answer.usage.prompt_tokens == 5
    decoded = sdk.embeddings.create(model="embed-hosted", input="six")  # the SDK's base64, decoded
    assert decoded.data[0].embedding == [1.0, 0.5, -0.25]
    headers, body = recorder.requests[sent]
    assert headers["authorization"] == f"Bearer {PROVIDER_KEY}"
    assert body["model"] == "text-embed-sim" and body["input"] == ["one two three", "four five"]
    assert body["user"] == "end-user-9"
    assert recorder.requests[sent + 1][1]["encoding_format"] == "base64"
    eventually(lambda: spend_today(gateway)["requests"] == before["requests"] + 2, "the requests were never booked")
    today = spend_today(gateway)
    assert today["prompt_tokens"] - before["prompt_tokens"] == 6
    assert today["usd"] - before["usd"] == pytest.approx(6 * HOSTED_USD_PER_MTOK / 1e6)
    spent = total(
        samples(gateway, "spillgate_spend_usd_total"), route="embed-hosted", backend="provider", kind="hosted"
    )
    assert spent - metric_before == pytest.approx(6 * HOSTED_USD_PER_MTOK / 1e6)


def test_round_robin_alternates_and_least_load_spreads_concurrent_requests(gateway: RunningProcess) -> None:
    sdk = client(gateway)

    def backend(model: str, text: str) -> str:
        raw = sdk.embeddings.with_raw_response.create(model=model, input=text, encoding_format="float")
        return raw.headers["x-spillgate-backend"]

    rotated = [backend("embed-rr", f"short text {i}") for i in range(4)]
    assert len(set(rotated)) == 2 and rotated[0] == rotated[2] and rotated[1] == rotated[3]
    long_text = "the state of the queue " * 300  # a prefill the replica takes a while over
    with ThreadPoolExecutor(4) as pool:
        spread = list(pool.map(lambda i: backend("embed", f"{i} {long_text}"), range(4)))
    assert len(set(spread)) == 2, spread


def test_prefix_policies_on_an_embeddings_route_route_by_load_or_by_the_inputs_hash(gateway: RunningProcess) -> None:
    sdk = client(gateway)

    def backend(model: str, text: str) -> str:
        raw = sdk.embeddings.with_raw_response.create(model=model, input=text, encoding_format="float")
        return raw.headers["x-spillgate-backend"]

    assert backend("embed-cache", "a cache-aware route") in {backend("embed-rr", "x"), backend("embed-rr", "y")}
    hashed = {text: backend("embed-hash", text) for text in (f"input number {i}" for i in range(12))}
    assert len(set(hashed.values())) == 2, "distinct inputs spread over the replicas"
    assert all(backend("embed-hash", text) == chosen for text, chosen in hashed.items()), "an input keeps its replica"


def test_each_route_takes_only_its_own_task(gateway: RunningProcess) -> None:
    sdk = client(gateway)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model="embed", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    error = refused.value.body
    assert error["param"] == "model" and error["code"] == "wrong_model_task"
    assert "/v1/embeddings" in error["message"]
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.completions.create(model="embed-hosted", prompt="hi", max_tokens=2)
    assert refused.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.embeddings.create(model="chat", input="hi")
    error = refused.value.body
    assert error["param"] == "model" and error["code"] == "wrong_model_task"
    assert "does not serve embeddings" in error["message"]
    answer = sdk.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert answer.choices[0].message.content is not None, "generation routes still generate"
    # The other APIs' faces go through chat's admission: refused the same way, in their own shape.
    message = {"model": "embed", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    refusal = httpx.post(gateway.url + "/v1/messages", json=message, headers=AUTH, timeout=10)
    assert refusal.status_code == 400 and "/v1/embeddings" in refusal.text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "embed"}, "input"),
        ({"model": "embed", "input": {"text": "x"}}, "input"),
        ({"model": "embed", "input": [1, "x"]}, "input"),
        ({"model": "embed", "input": "x", "encoding_format": "bytes"}, "encoding_format"),
        ({"model": "embed", "input": "x", "dimensions": 0}, "dimensions"),
        ({"model": "embed", "input": "x", "stream": True}, "stream"),
        ({"input": "x"}, "model"),
    ],
)
def test_malformed_bodies_are_refused_naming_the_field(gateway: RunningProcess, body: dict, param: str) -> None:
    answer = httpx.post(gateway.url + "/v1/embeddings", json=body, headers=AUTH, timeout=10)
    assert answer.status_code == 422
    assert answer.json()["error"]["param"] == param


def test_the_replicas_refusal_is_passed_on_and_an_unknown_route_is_a_404(gateway: RunningProcess) -> None:
    sdk = client(gateway)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.embeddings.create(model="embed", input="   ")
    assert refused.value.body["message"] == "Input cannot be empty or whitespace only"
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.embeddings.create(model="no-such-route", input="x")
    assert missing.value.body["code"] == "model_not_found"
    answer = httpx.post(
        gateway.url + "/embeddings", json={"model": "embed", "input": "x", "encoding_format": "float"}, headers=AUTH
    )
    assert answer.status_code == 200 and len(answer.json()["data"][0]["embedding"]) == HIDDEN_SIZE
    assert httpx.post(gateway.url + "/v1/embeddings", json={"model": "embed", "input": "x"}).status_code == 401


def test_the_access_log_has_one_line_per_embeddings_request(gateway: RunningProcess) -> None:
    request_id = f"embed-{time.monotonic_ns()}"
    answer = client(gateway).embeddings.create(
        model="embed", input="logged once", encoding_format="float", extra_headers={"x-request-id": request_id}
    )

    def lines() -> list[dict[str, Any]]:
        return [
            json.loads(text)
            for text in gateway.log().splitlines()
            if text.startswith("{") and f'"request_id":"{request_id}"' in text.replace(" ", "")
        ]

    eventually(lambda: len(lines()) == 1, "no access-log line")
    (line,) = lines()
    assert (line["path"], line["status"], line["outcome"], line["route"]) == ("/v1/embeddings", 200, "ok", "embed")
    assert line["prompt_tokens"] == answer.usage.prompt_tokens and line["output_tokens"] == 0


def test_a_live_edit_of_a_pools_task_changes_what_its_routes_take(gateway: RunningProcess) -> None:
    sdk = client(gateway)
    versioned = httpx.get(gateway.url + "/admin/config", headers=ADMIN).json()
    config = versioned["config"]
    (pool,) = [p for p in config["pools"] if p["name"] == "embedder"]
    pool["task"] = "generate"
    edited = httpx.put(gateway.url + "/admin/config", json=config, headers=ADMIN, timeout=30)
    assert edited.status_code == 200, edited.text
    try:
        answer = sdk.chat.completions.create(model="embed", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert answer.choices, "a generation route now"
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.embeddings.create(model="embed", input="hi")
        assert refused.value.body["code"] == "wrong_model_task"
    finally:
        rolled = httpx.post(gateway.url + f"/admin/config/rollback/{versioned['version']}", headers=ADMIN, timeout=30)
        assert rolled.status_code == 200, rolled.text
    assert len(sdk.embeddings.create(model="embed", input="hi").data) == 1


def test_a_hosted_models_failures_reach_the_client_in_openais_shape(gateway: RunningProcess) -> None:
    sdk = client(gateway)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.embeddings.create(model="embed-hosted", input="provider-refuses", encoding_format="float")
    assert "this input is not allowed" in refused.value.body["message"]
    assert PROVIDER_KEY not in str(refused.value.body)
    with pytest.raises(openai.APIStatusError) as failed:
        sdk.embeddings.create(model="embed-hosted", input="provider-breaks", encoding_format="float")
    assert failed.value.status_code == 502 and failed.value.body["code"].startswith("hosted_")
