"""Capture what real SGLang and vLLM servers answer, as fixtures under ``tests/fixtures/<engine>/<profile>/``.

Each profile is one server started with the engine's defaults (``defaults``) or with the flags the README
recommends plus an API key and a KV-event publisher (``recommended``). Every capture is a JSON file: the
engine, its version and flags, the request, the status, the content type, and the body (parsed JSON, the
``data:`` payloads of a stream, or text). Ids, timestamps and the random model's words are kept as they came:
tests compare names, types and presence, never those values.

    python -m tests.engines.capture [sglang] [vllm]     # needs python -m tests.engines.install first
    python -m tests.engines.capture --features [sglang] [vllm]   # only the client-feature fixtures
    python -m tests.engines.capture --responses [sglang] [vllm]  # only the Responses API fixtures

``--features`` starts one server per engine with the recommended flags, an API key and a Llama tool-call parser
(what a Llama deployment runs) and writes ``feature_*.json`` under ``recommended``:
``n``, tools with ``tool_choice`` required and named, ``logprobs``, ``response_format`` and ``stop``, whole and
streamed.

``--responses`` starts two servers per engine with the recommended flags and an API key, one as started plainly
and one that keeps responses (SGLang ``--enable-response-store``, vLLM ``VLLM_ENABLE_RESPONSES_API_STORE=1``), and
writes ``tests/fixtures/<engine>/responses/*.json``: ``/v1/responses`` whole and streamed, with ``instructions``,
cut by ``max_output_tokens`` and ended by a stop string, a warm prefix, ``previous_response_id``, retrieval and
cancelling, and the errors for unknown ids and models. A capture that names a stored response records
``uses_id_of``: the capture whose answer's ``id`` it sends, so a replay can send its own.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.engines.install import ENGINES, HERE, Installed, ensure
from tests.engines.servers import RECOMMENDED, SERVED_MODEL, model_context, start_engine
from tests.support.procs import RunningProcess, free_port

FIXTURES = HERE.parent / "fixtures"
API_KEY = "sk-engine-fixture"
LONG_WORDS = 700
"""Words of the long prompts: about 3,500 tokens of the tiny model, several prefill chunks' worth on a CPU."""


def prompt(tag: str, words: int = LONG_WORDS) -> str:
    return " ".join(f"{tag}{i}" for i in range(words))


def kv_events_flags(engine: str, port: int) -> tuple[tuple[str, ...], str, bool]:
    """The publisher's flags, the listener's endpoint, and whether the listener binds (vLLM connects to it)."""
    if engine == "sglang":
        config = {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv", "bind": True}
        return ("--kv-events-config", json.dumps(config)), f"tcp://127.0.0.1:{port}", False
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv"}
    return ("--kv-events-config", json.dumps(config)), f"tcp://127.0.0.1:{port}", True


class Recorder:
    """Sends requests to one server and writes each exchange as a fixture."""

    def __init__(self, server: RunningProcess, out: Path, meta: dict[str, Any], key: str | None) -> None:
        self.server = server
        self.out = out
        self.meta = meta
        self.headers = {"authorization": f"Bearer {key}"} if key else {}
        out.mkdir(parents=True, exist_ok=True)

    def get(
        self,
        name: str,
        path: str,
        *,
        authorized: bool = True,
        timeout: float = 30.0,
        extra: dict[str, Any] | None = None,
    ) -> httpx.Response:
        started = time.monotonic()
        response = httpx.get(self.server.url + path, headers=self.headers if authorized else {}, timeout=timeout)
        self._write(name, "GET", path, None, response, time.monotonic() - started, authorized=authorized, extra=extra)
        return response

    def post(
        self,
        name: str,
        path: str,
        body: dict[str, Any] | None,
        *,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> httpx.Response:
        started = time.monotonic()
        sent = self.headers if headers is None else headers
        with httpx.stream("POST", self.server.url + path, json=body, headers=sent, timeout=120) as response:
            response.read()
        seconds = time.monotonic() - started
        self._write(name, "POST", path, body, response, seconds, authorized=headers is None, extra=extra)
        return response

    def _write(
        self,
        name: str,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        response: httpx.Response,
        seconds: float,
        *,
        authorized: bool,
        extra: dict[str, Any] | None = None,
    ) -> None:
        content_type = response.headers.get("content-type", "")
        record: dict[str, Any] = {
            **self.meta,
            **(extra or {}),
            "request": {
                "method": method,
                "path": path,
                "body": body,
                "with_api_key": authorized and bool(self.headers),
            },
            "status": response.status_code,
            "content_type": content_type,
            "seconds": round(seconds, 3),
        }
        text = response.text
        if content_type.startswith("text/event-stream"):
            record["events"] = [
                json.loads(line[6:]) if line[6:] != "[DONE]" else "[DONE]"
                for line in text.splitlines()
                if line.startswith("data: ")
            ]
            names = [line[7:] for line in text.splitlines() if line.startswith("event: ")]
            if names:  # the Responses API names each event as well
                record["event_names"] = names
        else:
            try:
                record["body"] = json.loads(text) if text else None
            except json.JSONDecodeError:
                record["text"] = text
        (self.out / f"{name}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def chat(content: str, max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    body = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    return {**body, **extra}


def completion(text: str, max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {"model": SERVED_MODEL, "prompt": text, "max_tokens": max_tokens, **extra}


def busy(server: RunningProcess, headers: dict[str, str], requests: int = 3) -> Callable[[], None]:
    """Start ``requests`` long generations from other threads; the returned function waits for them."""

    def one(i: int) -> None:
        body = chat(prompt(f"busy{i}-", 300), max_tokens=200, ignore_eos=True)
        httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers, timeout=300)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(requests)]
    for thread in threads:
        thread.start()
    return lambda: [thread.join() for thread in threads]  # type: ignore[func-returns-value]


def capture_profile(installed: Installed, engine: str, profile: str, log_dir: Path) -> None:
    flags: tuple[str, ...] = ()
    listener = None
    key = None
    events_path = log_dir / f"{engine}-{profile}-kv.jsonl"
    if profile == "recommended":
        kv_flags, endpoint, bind = kv_events_flags(engine, free_port())
        flags = (*RECOMMENDED[engine], "--api-key", API_KEY, *kv_flags)
        key = API_KEY
        command = [str(installed.python[engine]), str(HERE / "kv_listen.py"), endpoint, str(events_path)]
        listener = subprocess.Popen([*command, *(["--bind"] if bind else [])], start_new_session=True)
    server = start_engine(installed, engine, log_dir, *flags)
    try:
        recorder = Recorder(server, FIXTURES / engine / profile, {"engine": engine, "flags": list(flags)}, key)
        version = _version(recorder, engine)
        recorder.meta["version"] = version
        _capture_endpoints(recorder, engine, profile, installed)
        if listener is not None:
            time.sleep(1.0)  # the publisher flushes after its next scheduler pass
            _write_kv_events(events_path, FIXTURES / engine / profile / "kv_events.json", recorder.meta)
    finally:
        server.stop()
        if listener is not None:
            listener.send_signal(signal.SIGTERM)
            listener.wait(10)


def _version(recorder: Recorder, engine: str) -> str:
    if engine == "vllm":
        return httpx.get(recorder.server.url + "/version", timeout=10).json()["version"]
    info = httpx.get(recorder.server.url + "/server_info", headers=recorder.headers, timeout=10).json()
    return info["version"]


def _capture_endpoints(recorder: Recorder, engine: str, profile: str, installed: Installed) -> None:
    context = model_context(installed)
    recorder.get("v1_models", "/v1/models")
    recorder.get("health", "/health")
    recorder.get("metrics_idle", "/metrics")
    if engine == "sglang":
        recorder.get("server_info", "/server_info")
        recorder.get("get_server_info", "/get_server_info")
        recorder.get("ready", "/ready")
        recorder.get("model_info", "/model_info")
    else:
        recorder.get("version", "/version")
        recorder.get("kv_event_sources", "/kv_event_sources")
        recorder.get("ready", "/ready")
    shared = prompt("shared")
    recorder.post("chat_cold", "/v1/chat/completions", chat(shared))
    recorder.post("chat_warm", "/v1/chat/completions", chat(shared))
    recorder.post(
        "chat_stream",
        "/v1/chat/completions",
        chat(shared + " more", stream=True, stream_options={"include_usage": True}),
    )
    recorder.post("chat_stream_no_usage", "/v1/chat/completions", chat("hello there", stream=True))
    recorder.post("completion", "/v1/completions", completion(prompt("plain", 200)))
    recorder.post(
        "completion_stream",
        "/v1/completions",
        completion(prompt("plain", 200), stream=True, stream_options={"include_usage": True}),
    )
    recorder.post("error_context_too_long", "/v1/chat/completions", chat(prompt("huge", context // 2)))
    recorder.post("error_output_too_long", "/v1/chat/completions", chat("hi", max_tokens=context + 10))
    recorder.post("error_bad_temperature", "/v1/chat/completions", chat("hi", temperature=-1))
    recorder.post("error_bad_max_tokens", "/v1/completions", completion("hi", max_tokens=-1))
    recorder.post("error_unknown_model", "/v1/chat/completions", {**chat("hi"), "model": "no-such-model"})
    if profile == "recommended":
        recorder.post("error_no_api_key", "/v1/chat/completions", chat("hi"), headers={})
        recorder.post("error_wrong_api_key", "/v1/chat/completions", chat("hi"), headers={"authorization": "Bearer x"})
        recorder.get("metrics_no_api_key", "/metrics", authorized=False)
        recorder.get("health_no_api_key", "/health", authorized=False)
    done = busy(recorder.server, recorder.headers)
    time.sleep(4.0)
    recorder.get("metrics_busy", "/metrics")
    if engine == "sglang":
        recorder.get("health_busy", "/health")
    done()
    time.sleep(1.0)
    recorder.get("metrics_after", "/metrics")


def _write_kv_events(source: Path, target: Path, meta: dict[str, Any]) -> None:
    records = [json.loads(line) for line in source.read_text().splitlines()] if source.exists() else []
    batches = [r for r in records if "batch" in r]
    # The first few batches show every field; all of them would be megabytes of token ids.
    target.write_text(json.dumps({**meta, "batches": batches[:3], "count": len(batches)}, indent=1) + "\n")


FEATURE_FLAGS = {
    "sglang": ("--tool-call-parser", "llama3"),
    "vllm": ("--enable-auto-tool-choice", "--tool-call-parser", "pythonic"),
}
"""Added for the feature captures: both engines serve a forced tool call only with a parser (vLLM refuses any
``tool_choice`` but "none" unless both flags are set; SGLang leaves the call's JSON in ``content``). vLLM's
``llama3_json`` needs ``<|python_tag|>`` in the tokenizer, which the tiny model lacks; ``required`` and named
calls take the same parser-independent path with any parser."""
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "detailed": {"type": "boolean"},
            },
            "required": ["unit", "detailed"],
        },
    },
}
CLOCK_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["utc", "local"]}},
            "required": ["zone"],
        },
    },
}
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "mood": {"type": "string", "enum": ["calm", "busy"]}},
    "required": ["ok", "mood"],
    "additionalProperties": False,
}
CONSTRAINED_TOKENS = 300
"""Room for a grammar-constrained answer of the random model to close its JSON."""


def feature_requests(stop_chat: str, stop_completion: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Name, path and body of each feature capture; each is also sent streamed (``<name>_stream``)."""
    tools = [WEATHER_TOOL, CLOCK_TOOL]
    named = {"type": "function", "function": {"name": "get_time"}}
    json_schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}}
    constrained = CONSTRAINED_TOKENS
    return [
        ("feature_chat_n2", "/v1/chat/completions", chat("two answers", n=2)),
        ("feature_completion_n2", "/v1/completions", completion("two answers", n=2)),
        (
            "feature_tools_required",
            "/v1/chat/completions",
            chat("weather?", constrained, tools=tools, tool_choice="required"),
        ),
        ("feature_tools_named", "/v1/chat/completions", chat("time?", constrained, tools=tools, tool_choice=named)),
        ("feature_chat_logprobs", "/v1/chat/completions", chat("scores", 4, logprobs=True, top_logprobs=2)),
        ("feature_completion_logprobs", "/v1/completions", completion("scores", 4, logprobs=2)),
        (
            "feature_json_object",
            "/v1/chat/completions",
            chat("json", constrained, response_format={"type": "json_object"}),
        ),
        ("feature_json_schema", "/v1/chat/completions", chat("json", constrained, response_format=json_schema)),
        ("feature_chat_stop", "/v1/chat/completions", chat("stop here", 16, temperature=0, stop=[stop_chat])),
        (
            "feature_completion_stop",
            "/v1/completions",
            completion("stop here", 16, temperature=0, stop=[stop_completion]),
        ),
    ]


def _stop_string(recorder: Recorder, path: str, body: dict[str, Any]) -> str:
    """Three characters from the middle of what the model writes greedily, so a stop string is certain to match."""
    answer = httpx.post(recorder.server.url + path, json=body, headers=recorder.headers, timeout=120).json()
    choice = answer["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    middle = max(1, len(text) // 2)
    return text[middle : middle + 3] if len(text) > 4 else text


def capture_features(installed: Installed, engine: str, log_dir: Path) -> None:
    flags = (*RECOMMENDED[engine], "--api-key", API_KEY, *FEATURE_FLAGS[engine])
    server = start_engine(installed, engine, log_dir, *flags)
    try:
        out = FIXTURES / engine / "recommended"
        recorder = Recorder(server, out, {"engine": engine, "flags": list(flags)}, API_KEY)
        recorder.meta["version"] = _version(recorder, engine)
        stop_chat = _stop_string(recorder, "/v1/chat/completions", chat("stop here", 16, temperature=0))
        stop_completion = _stop_string(recorder, "/v1/completions", completion("stop here", 16, temperature=0))
        for name, path, body in feature_requests(stop_chat, stop_completion):
            for stem, sent in ((name, body), (f"{name}_stream", _streamed(body))):
                try:
                    recorder.post(stem, path, sent)
                except httpx.HTTPError as exc:  # one failed capture should not lose the rest
                    print(f"{engine} {stem}: {exc!r}", file=sys.stderr)
    finally:
        server.stop()


def _streamed(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "stream": True, "stream_options": {"include_usage": True}}


RESPONSE_STORE: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "sglang": (("--enable-response-store",), {}),
    "vllm": ((), {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}),
}
"""What makes each engine keep responses for ``previous_response_id`` and retrieval: SGLang a flag (it refuses both
without it), vLLM an environment variable (without it ``store`` is silently ignored)."""
RESPONSES = "/v1/responses"


def response_body(text: str | list[dict[str, Any]], max_output_tokens: int | None = 8, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": SERVED_MODEL, "input": text, **extra}
    if max_output_tokens is not None:
        body["max_output_tokens"] = max_output_tokens
    return body


def _response_stop(recorder: Recorder, body: dict[str, Any]) -> str:
    """Three characters from the middle of the greedy answer, so a stop string is certain to end it."""
    answer = httpx.post(recorder.server.url + RESPONSES, json=body, headers=recorder.headers, timeout=120).json()
    text = "".join(part.get("text", "") for item in answer.get("output", []) for part in item.get("content", []) or [])
    middle = max(1, len(text) // 2)
    return text[middle : middle + 3] if len(text) > 4 else text


def _capture_responses_plain(recorder: Recorder) -> None:
    """What an engine started without a response store answers."""
    turns = [{"role": "user", "content": "first question"}, {"role": "assistant", "content": "first answer"}]
    turns.append({"role": "user", "content": "second question"})
    greedy = response_body("stop here", 16, temperature=0)
    stop = _response_stop(recorder, greedy)
    cases: list[tuple[str, dict[str, Any]]] = [
        ("plain", response_body("hello there")),
        ("instructions", response_body(turns, instructions="Answer briefly.")),
        ("stopped", {**greedy, "stop": [stop]}),
    ]
    for name, body in cases:
        recorder.post(name, RESPONSES, body)
        recorder.post(f"{name}_stream", RESPONSES, {**body, "stream": True})
    shared = prompt("shared", 200)
    recorder.post("cold", RESPONSES, response_body(shared))
    recorder.post("warm", RESPONSES, response_body(shared))
    recorder.post("error_unknown_model", RESPONSES, {**response_body("hi"), "model": "no-such-model"})
    recorder.post("error_no_input", RESPONSES, {"model": SERVED_MODEL})
    recorder.post("previous_unknown", RESPONSES, response_body("hi", previous_response_id="resp_unknown"))
    recorder.get("retrieve_unknown", f"{RESPONSES}/resp_unknown")


def _capture_responses_stored(recorder: Recorder) -> None:
    """What an engine that keeps responses answers: chaining, retrieval, cancelling."""
    first = recorder.post("store_first", RESPONSES, response_body("remember this")).json()
    ref = {"uses_id_of": "store_first"}
    then = response_body("and then?", previous_response_id=first["id"])
    recorder.post("store_chained", RESPONSES, then, extra=ref)
    recorder.post("store_chained_stream", RESPONSES, {**then, "stream": True}, extra=ref)
    recorder.get("store_retrieve", f"{RESPONSES}/{first['id']}", extra=ref)
    recorder.post("store_cancel_done", f"{RESPONSES}/{first['id']}/cancel", None, extra=ref)
    unkept = recorder.post("store_false", RESPONSES, response_body("forget this", store=False)).json()
    recorder.get("store_false_retrieve", f"{RESPONSES}/{unkept['id']}", extra={"uses_id_of": "store_false"})
    streamed = recorder.post("store_stream", RESPONSES, response_body("stream this", stream=True))
    streamed_id = next(
        json.loads(line[6:])["response"]["id"] for line in streamed.text.splitlines() if line.startswith("data: ")
    )
    recorder.get("store_stream_retrieve", f"{RESPONSES}/{streamed_id}", extra={"uses_id_of": "store_stream"})
    recorder.post("store_previous_unknown", RESPONSES, response_body("hi", previous_response_id="resp_unknown"))
    recorder.get("store_retrieve_unknown", f"{RESPONSES}/resp_unknown")
    recorder.get("store_retrieve_bad_id", f"{RESPONSES}/unknown")


def capture_responses(installed: Installed, engine: str, log_dir: Path) -> None:
    out = FIXTURES / engine / "responses"
    for stored in (False, True):
        store_flags, env = RESPONSE_STORE[engine] if stored else ((), {})
        flags = (*RECOMMENDED[engine], "--api-key", API_KEY, *store_flags)
        server = start_engine(installed, engine, log_dir, *flags, env=env)
        try:
            recorder = Recorder(server, out, {"engine": engine, "flags": list(flags), "env": env}, API_KEY)
            recorder.meta["version"] = _version(recorder, engine)
            (_capture_responses_stored if stored else _capture_responses_plain)(recorder)
        finally:
            server.stop()


def main(argv: list[str]) -> int:
    features, responses = "--features" in argv, "--responses" in argv
    engines = tuple(a for a in argv if a not in ("--features", "--responses")) or ENGINES
    installed = ensure(engines)
    with tempfile.TemporaryDirectory(prefix="spillgate-capture-") as tmp:
        for engine in engines:
            if features:
                print(f"capturing {engine} features", file=sys.stderr)
                capture_features(installed, engine, Path(tmp))
                continue
            if responses:
                print(f"capturing {engine} responses", file=sys.stderr)
                capture_responses(installed, engine, Path(tmp))
                continue
            for profile in ("defaults", "recommended"):
                print(f"capturing {engine} {profile}", file=sys.stderr)
                capture_profile(installed, engine, profile, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
