"""The client features held to what real SGLang 0.5.23 and vLLM 0.32 answered (``tests/fixtures/<engine>/recommended/
feature_*.json``, ``python -m tests.engines.capture --features``).

Each captured request is sent again to a simulator started with the real server's flags; the answer must have the
captured status and shape (names, types, nesting; ``tests/support/shapes.py``), not its values. Streams are compared
chunk kind by chunk kind (role, content, tool-call start, tool-call arguments, finish, usage): the first chunk of each
kind the real server sent against the simulator's first of the same kind.

Where the tiny random model could not produce what a real model would, the comparison says so and allows it:
a grammar-forced call the model ran past ``max_tokens`` comes back as text (the simulator's call is held to the
shape of the call the real parser did return), so ``tool_calls``, ``matched_stop`` and ``stop_reason`` may be
present on one side only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.sim.conftest import StartReplica
from tests.support.procs import RunningProcess
from tests.support.shapes import differences

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ENGINES = ("sglang", "vllm")
VALUE_DEPENDENT = (".matched_stop", ".stop_reason", ".message.tool_calls", ".message.content", ".delta.tool_calls")
"""Fields whose presence or nullness follows the model's words (a stop string matched, a call parsed)."""


def feature_fixtures(engine: str) -> list[Path]:
    return sorted((FIXTURES / engine / "recommended").glob("feature_*.json"))


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def sims(start_sim: StartReplica) -> dict[str, RunningProcess]:
    """One simulator per engine with the flags its feature captures were made with."""
    started = {}
    for engine in ENGINES:
        flags = load(feature_fixtures(engine)[0])["flags"]
        base = ["--bare", "--time-scale", "0.02", "--model-name", "tiny", "--context-length", "16384"]
        started[engine] = start_sim("sim-replica", *base, "--max-total-tokens", "65536", "--engine", engine, *flags)
    return started


def replay(sim: RunningProcess, record: dict[str, Any]) -> httpx.Response:
    flags = record["flags"]
    headers = {"authorization": f"Bearer {flags[flags.index('--api-key') + 1]}"}
    return httpx.post(sim.url + record["request"]["path"], json=record["request"]["body"], headers=headers, timeout=60)


def events_of(response: httpx.Response) -> list[Any]:
    return [
        json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]"
        for line in response.text.splitlines()
        if line.startswith("data: ")
    ]


def as_maps(value: Any) -> Any:
    """Legacy ``top_logprobs`` entries map tokens to numbers: compared as maps, not by their (random) keys."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            legacy = isinstance(item, list) and item and isinstance(item[0], dict) and "token" not in item[0]
            if key == "top_logprobs" and legacy:
                item = [{"<token>": next(iter(entry.values()))} for entry in item if entry]
            out[key] = as_maps(item)
        return out
    if isinstance(value, list):
        return [as_maps(item) for item in value]
    return value


def shape_problems(real: Any, sim: Any, path: str = "$", also: tuple[str, ...] = ()) -> list[str]:
    found = differences(as_maps(real), as_maps(sim), path)
    return [line for line in found if not any(field + ":" in line for field in (*VALUE_DEPENDENT, *also))]


def kind(event: Any) -> str:
    if event == "[DONE]":
        return "done"
    choices = event.get("choices") or []
    if not choices:
        return "usage"
    choice = choices[0]
    if choice.get("finish_reason") is not None:
        return "finish"
    delta = choice.get("delta")
    if delta is None:
        return "text"
    if delta.get("role"):
        return "role"
    calls = delta.get("tool_calls")
    if calls:
        return "call_start" if calls[0].get("id") else "call_arguments"
    return "content"


def first_of_each_kind(events: list[Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for event in events:
        found.setdefault(kind(event), event)
    return found


def cases() -> list[Any]:
    return [
        pytest.param(engine, path, id=f"{engine}/{path.stem}")
        for engine in ENGINES
        for path in feature_fixtures(engine)
    ]


@pytest.mark.parametrize(("engine", "path"), cases())
def test_the_simulator_answers_client_features_as_the_engine_did(
    sims: dict[str, RunningProcess], engine: str, path: Path
) -> None:
    record = load(path)
    response = replay(sims[engine], record)
    assert response.status_code == record["status"], response.text[:500]
    assert response.headers.get("content-type", "").split(";")[0] == record["content_type"].split(";")[0]
    if "events" not in record:
        assert not (found := shape_problems(record["body"], response.json())), "\n".join(found)
        return
    real, sim = first_of_each_kind(record["events"]), first_of_each_kind(events_of(response))
    forced_call = "tools" in path.stem
    expected = set(real) - ({"content"} if forced_call else set())  # the random model's unparsed text
    if forced_call:
        expected |= {"call_start", "call_arguments"}
    assert expected <= set(sim), f"chunk kinds the simulator did not send: {expected - set(sim)}"
    # vLLM's last chunk carries the last token's text: none when that token is the end of the sequence.
    last = {"finish": (".delta.content",)}
    found = [
        line
        for name in set(real) & set(sim)
        for line in shape_problems(real[name], sim[name], f"${name}", last.get(name, ()))
    ]
    assert not found, "\n".join(found)
    if "_n2" in path.stem:
        indices = {c["index"] for event in events_of(response) if event != "[DONE]" for c in event["choices"]}
        assert indices == {0, 1}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_simulated_tool_call_has_the_shape_the_real_parser_returned(
    sims: dict[str, RunningProcess], engine: str
) -> None:
    """The tiny model rarely closes a call's JSON; the calls the real parser did return fix the shape of
    ``tool_calls`` entries, whole and streamed, for both ``required`` and a named tool."""
    parsed = [
        call
        for path in feature_fixtures(engine)
        if "tools" in path.stem and "body" in (record := load(path)) and record["status"] == 200
        for choice in record["body"]["choices"]
        for call in choice["message"].get("tool_calls") or []
    ]
    if not parsed:
        pytest.skip(f"the captured {engine} answers hold no parsed call")
    for path in feature_fixtures(engine):
        if "tools" not in path.stem or path.stem.endswith("_stream"):
            continue
        body = replay(sims[engine], load(path)).json()
        calls = body["choices"][0]["message"]["tool_calls"]
        assert not (found := differences(parsed[0], calls[0])), "\n".join(found)
