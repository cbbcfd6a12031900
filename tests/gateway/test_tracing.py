"""Traces: a client's ``traceparent`` reaches the replica and the hosted provider, unchanged while tracing is off
and naming the gateway's upstream span while it is on; spans go out over OTLP, and form one tree per request.

The replica and the provider are :class:`Recorder`, a small real HTTP server in this process that answers as an
OpenAI-compatible server, records the headers it is sent, and takes OTLP exports. The span tree is also checked
with the gateway app served in this process over a simulated replica, its spans kept by the SDK's in-memory
exporter.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spillgate.gateway.app import GatewayApp
from spillgate.gateway.control.config import parse_config
from spillgate.gateway.observability.tracing import Tracing, provider_from
from spillgate.gateway.state import build_state
from tests.support.gateway import TENANT_KEY, gateway_config, replica_name, start_replica, words
from tests.support.procs import RunningProcess, free_port, start_spillgate

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
TRACESTATE = "vendor=opaque-value"
HELLO = [{"role": "user", "content": "hello"}]
CHAT = "/v1/chat/completions"
AUTH = {"authorization": f"Bearer {TENANT_KEY}"}
PROVIDER_KEY = "sk-provider-for-tests"


class Recorder(ThreadingHTTPServer):
    """An OpenAI-compatible server that records each completion request's headers, and an OTLP/HTTP trace
    receiver that keeps each export."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _RecorderHandler)
        self.requests: list[dict[str, str]] = []
        self.exports: list[ExportTraceServiceRequest] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class _RecorderHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Recorder

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._answer(200, "application/json", {"object": "list", "data": [{"id": "sim-model", "object": "model"}]})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.path == "/v1/traces":
            self.server.exports.append(ExportTraceServiceRequest.FromString(body))
            self._answer(200, "application/x-protobuf", b"")
            return
        self.server.requests.append({name.lower(): value for name, value in self.headers.items()})
        request = json.loads(body)
        if self.path == "/v1/messages":
            self._answer_messages(request)
            return
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        if not request.get("stream"):
            choice = {"index": 0, "message": {"role": "assistant", "content": "hi!"}, "finish_reason": "stop"}
            self._answer(
                200, "application/json", {"id": "c1", "object": "chat.completion", "choices": [choice], "usage": usage}
            )
            return
        delta = {"index": 0, "delta": {"role": "assistant", "content": "hi!"}, "finish_reason": "stop"}
        chunk = {"id": "c1", "object": "chat.completion.chunk", "choices": [delta]}
        last = {"id": "c1", "object": "chat.completion.chunk", "choices": [], "usage": usage}
        events = f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(last)}\n\ndata: [DONE]\n\n"
        self._answer(200, "text/event-stream", events.encode())

    def _answer_messages(self, request: dict[str, Any]) -> None:
        """Anthropic's Messages API, as litellm calls it for an ``anthropic/`` model."""
        message = {"id": "msg_1", "type": "message", "role": "assistant", "model": request["model"]}
        if not request.get("stream"):
            content = [{"type": "text", "text": "hi!"}]
            usage = {"input_tokens": 3, "output_tokens": 2}
            whole = {**message, "content": content, "stop_reason": "end_turn", "stop_sequence": None, "usage": usage}
            self._answer(200, "application/json", whole)
            return
        events = [
            (
                "message_start",
                {"message": {**message, "content": [], "usage": {"input_tokens": 3, "output_tokens": 0}}},
            ),
            ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "hi!"}}),
            ("content_block_stop", {"index": 0}),
            ("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
            ("message_stop", {}),
        ]
        text = "".join(f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n" for kind, data in events)
        self._answer(200, "text/event-stream", text.encode())

    def _answer(self, status: int, media_type: str, body: object) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", media_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def serve(recorder: Recorder, tmp_path: Path, env: dict[str, str]) -> RunningProcess:
    """A gateway process whose route ``chat`` reaches the recorder as a replica, ``hosted`` as a provider."""
    config = gateway_config([recorder.url])
    config["pools"][0]["engine"] = "openai"
    config["hosted_models"] = [
        {
            "name": "provider",
            "model": "openai/sim-model",
            "api_base": recorder.url + "/v1",
            "api_key": PROVIDER_KEY,
            "input_per_mtok": 1,
            "output_per_mtok": 2,
        }
    ]
    config["hosted_models"].append(
        {
            "name": "claude",
            "model": "anthropic/claude-sim",
            "api_base": recorder.url,
            "api_key": PROVIDER_KEY,
            "input_per_mtok": 1,
            "output_per_mtok": 2,
        }
    )
    config["routes"].append({"name": "hosted", "targets": ["provider"]})
    config["routes"].append({"name": "anthropic", "targets": ["claude"]})
    config["state"] = {"data_dir": str(tmp_path / "data")}
    config["health"]["generation_check_s"] = 0  # the recorder keeps only the requests the tests send
    port = free_port()
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    command = ["serve", "--config", str(path), "--port", str(port)]
    return start_spillgate(command, port=port, log_dir=tmp_path, env=env)


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


TRACING_OFF = {"OTEL_TRACES_EXPORTER": "", "OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ""}


@pytest.mark.parametrize("model", ["chat", "hosted", "anthropic"])
def test_with_tracing_off_the_clients_traceparent_reaches_the_backend_unchanged(
    recorder: Recorder, tmp_path: Path, model: str
) -> None:
    """To a replica, to an OpenAI-compatible provider and, through litellm, to Anthropic's API; whole and streamed."""
    gateway = serve(recorder, tmp_path, TRACING_OFF)
    try:
        for stream in (False, True):
            body = {"model": model, "messages": HELLO, "max_tokens": 2, "stream": stream}
            headers = {**AUTH, "traceparent": TRACEPARENT, "tracestate": TRACESTATE}
            assert httpx.post(gateway.url + CHAT, json=body, headers=headers, timeout=30).status_code == 200
            assert httpx.post(gateway.url + CHAT, json=body, headers=AUTH, timeout=30).status_code == 200
            bad = {**AUTH, "traceparent": f"00-{'0' * 32}-{CLIENT_SPAN}-01", "tracestate": TRACESTATE}
            assert httpx.post(gateway.url + CHAT, json=body, headers=bad, timeout=30).status_code == 200
    finally:
        gateway.stop()
    assert len(recorder.requests) == 6
    for traced, untraced, malformed in (recorder.requests[:3], recorder.requests[3:]):
        assert traced["traceparent"] == TRACEPARENT
        assert traced["tracestate"] == TRACESTATE
        assert "traceparent" not in untraced
        assert "traceparent" not in malformed and "tracestate" not in malformed, "a malformed traceparent is dropped"


def test_with_tracing_on_spans_go_out_over_otlp_and_the_backend_is_told_the_upstream_span(
    recorder: Recorder, tmp_path: Path
) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": recorder.url,
        "OTEL_SERVICE_NAME": "gateway-under-test",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    gateway = serve(recorder, tmp_path, env)
    try:
        for model in ("chat", "hosted"):
            body = {"model": model, "messages": HELLO, "max_tokens": 2, "stream": True}
            headers = {**AUTH, "traceparent": TRACEPARENT, "x-request-id": f"traced-{model}"}
            assert httpx.post(gateway.url + CHAT, json=body, headers=headers, timeout=30).status_code == 200
        eventually(lambda: len(_otlp_spans(recorder, "POST /v1/chat/completions")) == 2)
    finally:
        gateway.stop()
    spans = _otlp_spans(recorder)
    by_id = {span.span_id.hex(): span for span in spans}
    for sent, model in zip(recorder.requests, ("chat", "hosted"), strict=True):
        version, trace_id, parent_id, flags = sent["traceparent"].split("-")
        assert (version, trace_id, flags) == ("00", TRACE_ID, "01"), "the client's trace goes on"
        upstream = by_id[parent_id]
        assert upstream.name == "upstream", "the backend's parent is the gateway's upstream span"
        request = by_id[upstream.parent_span_id.hex()]
        assert request.name == "POST /v1/chat/completions"
        assert request.parent_span_id.hex() == CLIENT_SPAN, "the request span is a child of the client's"
        attributes = {a.key: a.value for a in request.attributes}
        assert attributes["gen_ai.request.model"].string_value == model
        assert attributes["http.response.status_code"].int_value == 200
        assert attributes["gen_ai.usage.output_tokens"].int_value == 2
        children = {span.name for span in spans if span.parent_span_id == request.span_id}
        assert {"admission", "upstream"} <= children
        assert any(s.name == "first_token" and s.parent_span_id == upstream.span_id for s in spans)
        assert f'"trace_id":"{TRACE_ID}"' in gateway.log()
    services = {
        a.value.string_value
        for e in recorder.exports
        for r in e.resource_spans
        for a in r.resource.attributes
        if a.key == "service.name"
    }
    assert services == {"gateway-under-test"}
    assert PROVIDER_KEY not in str(recorder.exports) and TENANT_KEY not in str(recorder.exports)


def _otlp_spans(recorder: Recorder, name: str | None = None) -> list[Any]:
    return [
        span
        for export in list(recorder.exports)
        for resource in export.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
        if name is None or span.name == name
    ]


# The span tree, in process ---------------------------------------------------------------------------------------


class InProcess:
    """The gateway app served by uvicorn on a thread of this process, its spans kept in memory."""

    def __init__(self, config: dict[str, Any]) -> None:
        parsed = parse_config(config)
        self.state = build_state(parsed, {}, {})
        self.exporter = InMemorySpanExporter()
        provider = provider_from({}, [SimpleSpanProcessor(self.exporter)])
        self.app = GatewayApp(self.state, tracing=Tracing(provider))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> InProcess:
        self.thread.start()
        eventually(lambda: self.server.started)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def trace(self, trace_id: str) -> list[ReadableSpan]:
        """The spans of a trace, once its request span has ended (a moment after the client read the answer)."""

        def spans() -> list[ReadableSpan]:
            return [s for s in self.exporter.get_finished_spans() if format(s.context.trace_id, "032x") == trace_id]

        eventually(lambda: any(s.name == "POST /v1/chat/completions" for s in spans()))
        return spans()


def tree(spans: list[ReadableSpan]) -> dict[str, str]:
    """Each span's name with its parent's name (``-`` for the root, or a parent outside the trace's spans)."""
    names = {span.context.span_id: span.name for span in spans}
    return {span.name: names.get(span.parent.span_id, "-") if span.parent else "-" for span in spans}


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    proc = start_replica(tmp_path_factory.mktemp("traced-replica"), "--time-scale", "0.02")
    yield proc
    proc.stop()


def test_one_span_tree_per_request_in_process(replica: RunningProcess, tmp_path: Path) -> None:
    config = gateway_config([replica.url], state={"data_dir": str(tmp_path / "data")})
    with InProcess(config) as gateway:
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
        client.chat.completions.create(model="chat", messages=HELLO, max_tokens=3)  # type: ignore[arg-type]
        eventually(lambda: any(s.name == "POST /v1/chat/completions" for s in gateway.exporter.get_finished_spans()))
        roots = [s for s in gateway.exporter.get_finished_spans() if s.name == "POST /v1/chat/completions"]
        assert len(roots) == 1 and roots[0].parent is None, "without a client's trace, the request starts one"
        trace_id = format(roots[0].context.trace_id, "032x")
        assert tree(gateway.trace(trace_id)) == {
            "POST /v1/chat/completions": "-",
            "admission": "POST /v1/chat/completions",
            "decision": "admission",
            "upstream": "POST /v1/chat/completions",
            "first_token": "upstream",
        }
        spans = {s.name: s for s in gateway.trace(trace_id)}
        assert spans["decision"].attributes["spillgate.backend"] == replica_name(replica)
        assert spans["upstream"].attributes["spillgate.outcome"] == "ok"
        root = spans["POST /v1/chat/completions"]
        assert root.attributes["spillgate.tenant"] == "tenant-a"
        assert root.start_time <= spans["first_token"].start_time <= spans["first_token"].end_time <= root.end_time

        refused = httpx.post(
            gateway.url + CHAT,
            json={"model": "no-such-model", "messages": HELLO},
            headers={**AUTH, "traceparent": TRACEPARENT},
        )
        assert refused.status_code == 404
        assert tree(gateway.trace(TRACE_ID)) == {
            "POST /v1/chat/completions": "-",
            "admission": "POST /v1/chat/completions",
        }
        spans = {s.name: s for s in gateway.trace(TRACE_ID)}
        assert format(spans["POST /v1/chat/completions"].parent.span_id, "016x") == CLIENT_SPAN
        assert spans["POST /v1/chat/completions"].attributes["error.type"] == "model_not_found"
        assert not spans["admission"].status.is_ok


def test_a_held_request_has_a_hold_span(tmp_path: Path) -> None:
    """Any prompt waiting unscheduled at the replica holds the next streamed one (as in test_prompt_hold)."""
    slow = start_replica(tmp_path, "--preset", "llama-3.1-8b-h100", "--time-scale", "3")
    try:
        config = gateway_config([slow.url], state={"data_dir": str(tmp_path / "data")})
        config["pools"][0]["max_waiting_prefill_tokens"] = 1
        with InProcess(config) as gateway:

            def stream(prompt: str, headers: dict[str, str] | None = None) -> None:
                body = {"model": "chat", "messages": [{"role": "user", "content": prompt}], "max_tokens": 2}
                body["stream"] = True
                with httpx.stream("POST", gateway.url + CHAT, json=body, headers={**AUTH, **(headers or {})}) as r:
                    r.read()

            blocker = threading.Thread(target=stream, args=(words("block", 2000),))
            blocker.start()
            time.sleep(0.15)
            waiting = threading.Thread(target=stream, args=(words("wait", 1000),))
            waiting.start()
            time.sleep(0.1)
            stream(words("held", 1000), {"traceparent": TRACEPARENT})
            waiting.join()
            blocker.join()
            shape = tree(gateway.trace(TRACE_ID))
            assert shape["hold"] == "POST /v1/chat/completions"
            assert shape["upstream"] == "POST /v1/chat/completions"
            hold = next(s for s in gateway.trace(TRACE_ID) if s.name == "hold")
            assert hold.attributes["cause"] == "prefill_queue"
    finally:
        slow.stop()


def test_tracing_is_off_unless_the_environment_asks() -> None:
    assert not Tracing.from_environment({}).on
    assert not Tracing.from_environment({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "x"}).on
    assert not Tracing.from_environment({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}).on
    on = Tracing.from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert on.on
    on.shutdown()
