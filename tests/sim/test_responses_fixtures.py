"""The simulator's Responses API held to what real SGLang 0.5.23 and vLLM 0.32 answered
(``tests/fixtures/<engine>/responses/``, ``python -m tests.engines.capture --responses``).

Each captured request is sent again to a simulator started with the real server's flags and environment (one as
started plainly, one that keeps responses). The answer must have the captured status and shape (names, types,
nesting; ``tests/support/shapes.py``), and an error the same type, parameter and message. A stream must send the
same events in the same order (any number of text deltas), numbered from 0, each shaped as the real server's first
event of its type. A capture that names a stored response (``uses_id_of``) is replayed after the capture it names,
with the simulator's own id; the stop-string capture with a stop string taken from the simulator's own words.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.procs import RunningProcess, free_port, start_spillgate
from tests.support.shapes import differences

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ENGINES = ("sglang", "vllm")
STORE_ENV = "VLLM_ENABLE_RESPONSES_API_STORE"
BLOCK = 16
"""The simulated vLLM's KV block (real vLLM on a CPU: 128)."""


def captures(engine: str) -> dict[str, dict[str, Any]]:
    return {
        path.stem: json.loads(path.read_text()) for path in sorted((FIXTURES / engine / "responses").glob("*.json"))
    }


def server_of(record: dict[str, Any]) -> tuple[str, bool]:
    """Which simulator replays a capture: its engine, and whether it keeps responses."""
    return record["engine"], "--enable-response-store" in record["flags"] or bool(record["env"].get(STORE_ENV))


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, bool], RunningProcess]]:
    """Four simulators: each engine as started plainly and keeping responses, with the captures' flags."""
    log_dir = tmp_path_factory.mktemp("responses-fixtures")
    started: dict[tuple[str, bool], RunningProcess] = {}
    try:
        for engine in ENGINES:
            for record in captures(engine).values():
                key = server_of(record)
                if key in started:
                    continue
                port = free_port()
                base = ["--time-scale", "0.02", "--model-name", "tiny", "--context-length", "16384"]
                args = ["sim-replica", "--port", str(port), *base, "--max-total-tokens", "65536", "--engine", engine]
                ready = "/health" if engine == "vllm" else "/ready"
                env = {STORE_ENV: "0", **record["env"]}
                started[key] = start_spillgate(
                    [*args, *record["flags"]], port=port, log_dir=log_dir, ready_path=ready, env=env
                )
        yield started
    finally:
        for proc in started.values():
            proc.stop()


def headers_of(record: dict[str, Any]) -> dict[str, str]:
    flags = record["flags"]
    return {"authorization": f"Bearer {flags[flags.index('--api-key') + 1]}"}


def send(sim: RunningProcess, record: dict[str, Any], path: str, body: Any) -> httpx.Response:
    method = record["request"]["method"]
    return httpx.request(method, sim.url + path, json=body, headers=headers_of(record), timeout=60)


def events_of(response: httpx.Response) -> tuple[list[str], list[dict[str, Any]]]:
    """A stream's event names and payloads."""
    lines = response.text.splitlines()
    names = [line[7:] for line in lines if line.startswith("event: ")]
    return names, [json.loads(line[6:]) for line in lines if line.startswith("data: ")]


def response_id(record_or_answer: dict[str, Any]) -> str:
    if "events" in record_or_answer:
        return record_or_answer["events"][0]["response"]["id"]
    return record_or_answer["body"]["id"]


def answer_id(response: httpx.Response) -> str:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return events_of(response)[1][0]["response"]["id"]
    return response.json()["id"]


def stop_from_own_words(sim: RunningProcess, record: dict[str, Any], body: dict[str, Any]) -> list[str]:
    """Three characters from the middle of what the simulator answers greedily, as the capture chose its stop."""
    greedy = {key: value for key, value in body.items() if key not in ("stop", "stream")}
    answer = httpx.post(sim.url + "/v1/responses", json=greedy, headers=headers_of(record), timeout=60).json()
    text = answer["output"][0]["content"][0]["text"]
    middle = len(text) // 2
    return [text[middle : middle + 3]]


def replay(sims: dict[tuple[str, bool], RunningProcess], engine: str, name: str) -> tuple[httpx.Response, str]:
    """The simulator's answer to capture ``name``, and the real id it stands for (replaced by the simulator's)."""
    records = captures(engine)
    record = records[name]
    sim = sims[server_of(record)]
    path, body = record["request"]["path"], record["request"]["body"]
    if name.startswith("stopped"):
        body = {**body, "stop": stop_from_own_words(sim, record, body)}
    used = record.get("uses_id_of")
    if used is not None:
        real_id, (first, _) = response_id(records[used]), replay(sims, engine, used)
        path = path.replace(real_id, answer_id(first))
        body = json.loads(json.dumps(body).replace(real_id, answer_id(first))) if body else body
    return send(sim, record, path, body), path


def collapsed(names: list[str]) -> list[str]:
    """Event names with each run of text deltas as one (how many follows the engine's batching)."""
    out: list[str] = []
    for name in names:
        if not (out and name == out[-1] == "response.output_text.delta"):
            out.append(name)
    return out


def cases() -> list[Any]:
    return [pytest.param(engine, name, id=f"{engine}/{name}") for engine in ENGINES for name in captures(engine)]


@pytest.mark.parametrize(("engine", "name"), cases())
def test_the_simulator_answers_the_responses_api_as_the_engine_did(
    sims: dict[tuple[str, bool], RunningProcess], engine: str, name: str
) -> None:
    record = captures(engine)[name]
    response, path = replay(sims, engine, name)
    assert response.status_code == record["status"], response.text[:500]
    assert response.headers.get("content-type", "").split(";")[0] == record["content_type"].split(";")[0]
    if "events" not in record:
        body = response.json()
        assert not (found := differences(record["body"], body)), "\n".join(found)
        if record["status"] >= 400:
            real, sim = record["body"]["error"], body["error"]
            assert (sim["type"], sim["param"], sim["code"]) == (real["type"], real["param"], real["code"])
            if "validation error" not in real["message"]:  # a validation message names the server's own code
                real_path = record["request"]["path"]
                assert sim["message"] == real["message"].replace(real_path.rsplit("/", 1)[-1], path.rsplit("/", 1)[-1])
        else:
            assert body["status"] == record["body"]["status"]
        return
    names, payloads = events_of(response)
    assert collapsed(names) == collapsed(record["event_names"])
    assert [event["type"] for event in payloads] == names
    assert [event["sequence_number"] for event in payloads] == list(range(len(payloads)))
    assert "[DONE]" not in response.text
    real_first = {event["type"]: event for event in reversed(record["events"])}
    sim_first = {event["type"]: event for event in reversed(payloads)}
    found = [line for kind in real_first for line in differences(real_first[kind], sim_first[kind], f"${kind}")]
    assert not found, "\n".join(found)
    assert payloads[-1]["response"]["status"] == record["events"][-1]["response"]["status"]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_output_stops_where_the_engine_stops_it(sims: dict[tuple[str, bool], RunningProcess], engine: str) -> None:
    """SGLang generates ``max_output_tokens - 2`` tokens (it keeps two for BOS and EOS), vLLM ``max_output_tokens``."""
    for name in ("plain", "instructions", "store_first"):
        real = captures(engine)[name]["body"]["usage"]["output_tokens"]
        response, _ = replay(sims, engine, name)
        assert response.json()["usage"]["output_tokens"] == real


@pytest.mark.parametrize("engine", ENGINES)
def test_a_repeated_input_is_read_from_the_prefix_cache(
    sims: dict[tuple[str, bool], RunningProcess], engine: str
) -> None:
    """Both engines report the cached prompt tokens of a Responses request (vLLM in whole blocks)."""
    records = captures(engine)
    real_cold, real_warm = (
        records[name]["body"]["usage"]["input_tokens_details"]["cached_tokens"] for name in ("cold", "warm")
    )
    assert real_warm > real_cold
    record = records["cold"]
    body = record["request"]["body"]
    body = {**body, "input": f"{uuid.uuid4().hex} {body['input']}"}  # new to this simulator, whatever ran before
    cold, warm = (send(sims[server_of(record)], record, "/v1/responses", body).json() for _ in range(2))
    cached = warm["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached > cold["usage"]["input_tokens_details"]["cached_tokens"]
    if engine == "vllm":
        assert cached % BLOCK == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_chained_response_is_shown_the_stored_conversation(
    sims: dict[tuple[str, bool], RunningProcess], engine: str
) -> None:
    """``previous_response_id`` puts the stored input and reply before the new input, as both engines do."""
    records = captures(engine)
    real_first, real_chained = records["store_first"]["body"]["usage"], records["store_chained"]["body"]["usage"]
    assert real_chained["input_tokens"] > real_first["input_tokens"] + real_first["output_tokens"]
    chained, _ = replay(sims, engine, "store_chained")  # replays store_first first, for its id
    body = chained.json()
    first_again = httpx.get(
        sims[engine, True].url + f"/v1/responses/{body['previous_response_id']}",
        headers=headers_of(records["store_first"]),
        timeout=30,
    ).json()
    shown = first_again["usage"]["input_tokens"] + first_again["usage"]["output_tokens"]
    assert body["usage"]["input_tokens"] > shown
