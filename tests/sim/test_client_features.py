"""What clients send beyond a prompt, served by both simulated faces and read with the official openai SDK: ``n``
choices, forced tool calls, logprobs, ``response_format`` and ``stop``, whole and streamed, the same by seed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.sim.conftest import StartReplica
from tests.support.gateway import TENANT_KEY, gateway_over_one_replica
from tests.support.procs import RunningProcess

MODEL = "sim-model"
PARSER = {"sglang": "llama3", "vllm": "llama3_json"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
                "threshold": {"type": "number"},
                "detailed": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["utc", "local"]}}},
    },
}
TOOLS = [WEATHER, CLOCK]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
ANSWER = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "mood": {"type": "string", "enum": ["calm", "busy"]},
        "score": {"type": "number"},
        "items": {"type": "array", "items": {"type": "integer"}},
    },
    "required": ["ok", "mood", "score", "items"],
    "additionalProperties": False,
}
USER = [{"role": "user", "content": "What should I know today?"}]


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def face(request: pytest.FixtureRequest, start_sim: StartReplica) -> tuple[str, RunningProcess]:
    engine = request.param
    sim = start_sim(
        "sim-replica", "--time-scale", "0.02", "--model-name", MODEL, "--engine", engine,
        "--tool-call-parser", PARSER[engine], "--enable-auto-tool-choice",
    )  # fmt: skip
    return engine, sim


@pytest.fixture
def client(face: tuple[str, RunningProcess]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=face[1].url + "/v1", api_key="unused", max_retries=0) as sdk:
        yield sdk


def chat(client: openai.OpenAI, **extra: Any) -> Any:
    return client.chat.completions.create(model=MODEL, messages=USER, **extra)  # type: ignore[call-overload]


def streamed(client: openai.OpenAI, **extra: Any) -> list[Any]:
    return list(chat(client, stream=True, stream_options={"include_usage": True}, **extra))


def test_n_choices_each_with_its_index_and_one_usage_over_all(client: openai.OpenAI) -> None:
    one = chat(client, max_tokens=6, seed=7)
    two = chat(client, max_tokens=6, seed=7, n=2)
    assert [choice.index for choice in two.choices] == [0, 1]
    assert two.choices[0].message.content == one.choices[0].message.content  # choice 0 is the n=1 answer
    assert two.choices[1].message.content != two.choices[0].message.content
    assert two.usage.prompt_tokens == one.usage.prompt_tokens
    assert two.usage.completion_tokens == 2 * one.usage.completion_tokens == 12
    assert chat(client, max_tokens=6, seed=7, n=2).choices[1].message.content == two.choices[1].message.content

    chunks = streamed(client, max_tokens=6, seed=7, n=2)
    text = {0: "", 1: ""}
    finished = {}
    for chunk in chunks:
        for choice in chunk.choices:
            text[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished[choice.index] = choice.finish_reason
    assert text == {i: two.choices[i].message.content for i in (0, 1)}
    assert finished == {0: "length", 1: "length"}
    assert chunks[-1].usage.completion_tokens == 12 and chunks[-1].choices == []

    completion = client.completions.create(model=MODEL, prompt="Once", max_tokens=5, n=3)
    assert [choice.index for choice in completion.choices] == [0, 1, 2]
    assert completion.usage.completion_tokens == 15


def _check_call(call: Any, name: str | None = None) -> dict[str, Any]:
    assert call.type == "function" and call.id
    assert name is None or call.function.name == name
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


@pytest.mark.parametrize("named", [False, True], ids=["required", "named"])
def test_a_forced_tool_call_comes_back_as_tool_calls_whole_and_streamed(
    face: tuple[str, RunningProcess], client: openai.OpenAI, named: bool
) -> None:
    engine = face[0]
    tool_choice: Any = {"type": "function", "function": {"name": "get_weather"}} if named else "required"
    answer = chat(client, tools=TOOLS, tool_choice=tool_choice, seed=3)
    choice = answer.choices[0]
    assert len(choice.message.tool_calls) == 1
    arguments = _check_call(choice.message.tool_calls[0], "get_weather" if named else None)
    # OpenAI's convention, which vLLM follows: a named tool ends with "stop"; SGLang says "tool_calls" for both.
    assert choice.finish_reason == ("stop" if named and engine == "vllm" else "tool_calls")
    assert not choice.message.content
    again = chat(client, tools=TOOLS, tool_choice=tool_choice, seed=3).choices[0].message.tool_calls[0]
    assert (
        json.loads(again.function.arguments) == arguments
        and again.function.name == choice.message.tool_calls[0].function.name
    )

    chunks = streamed(client, tools=TOOLS, tool_choice=tool_choice, seed=3)
    deltas = [call for chunk in chunks for c in chunk.choices for call in c.delta.tool_calls or []]
    assert deltas[0].id and deltas[0].function.name == choice.message.tool_calls[0].function.name
    assert all(delta.id is None and not delta.function.name for delta in deltas[1:])
    assert len(deltas) > 2  # the arguments arrive piece by piece
    assert json.loads("".join(delta.function.arguments or "" for delta in deltas)) == arguments
    assert [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason] == [choice.finish_reason]
    assert chunks[-1].usage.completion_tokens == answer.usage.completion_tokens


def test_tool_calls_for_every_choice_and_schema(client: openai.OpenAI) -> None:
    answer = chat(client, tools=TOOLS, tool_choice="required", n=4, seed=11)
    names = set()
    for choice in answer.choices:
        _check_call(choice.message.tool_calls[0])
        names.add(choice.message.tool_calls[0].function.name)
    assert names <= {"get_weather", "get_time"}


def test_a_call_cut_by_max_tokens_stays_text(client: openai.OpenAI) -> None:
    choice = chat(client, tools=TOOLS, tool_choice="required", max_tokens=3).choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls and choice.message.content


def test_auto_tool_choice_answers_in_text(client: openai.OpenAI) -> None:
    choice = chat(client, tools=TOOLS, max_tokens=5).choices[0]
    assert choice.message.content and not choice.message.tool_calls


def test_without_a_parser_sglang_leaves_the_call_in_content_and_vllm_refuses(
    face: tuple[str, RunningProcess], start_sim: StartReplica
) -> None:
    engine = face[0]
    sim = start_sim("sim-replica", "--time-scale", "0.02", "--model-name", MODEL, "--engine", engine)
    with openai.OpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0) as plain:
        if engine == "vllm":
            with pytest.raises(openai.BadRequestError, match="requires --tool-call-parser"):
                chat(plain, tools=TOOLS, tool_choice="required")
            with pytest.raises(openai.BadRequestError, match="--enable-auto-tool-choice"):
                chat(plain, tools=TOOLS)
            return
        choice = chat(plain, tools=TOOLS, tool_choice="required").choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    calls = json.loads(choice.message.content)
    jsonschema.validate(calls[0]["parameters"], SCHEMAS[calls[0]["name"]])


def test_chat_logprobs_cover_every_token_with_its_top_alternatives(client: openai.OpenAI) -> None:
    answer = chat(client, max_tokens=5, logprobs=True, top_logprobs=2)
    content = answer.choices[0].logprobs.content
    assert len(content) == answer.usage.completion_tokens == 5
    assert "".join(item.token for item in content) == answer.choices[0].message.content
    for item in content:
        assert item.logprob <= 0 and bytes(item.bytes) == item.token.encode()
        assert len(item.top_logprobs) == 2
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
    assert chat(client, max_tokens=5, logprobs=True, top_logprobs=2).choices[0].logprobs.content == content
    assert chat(client, max_tokens=5).choices[0].logprobs is None

    chunks = streamed(client, max_tokens=5, logprobs=True, top_logprobs=2)
    pieces = [item for chunk in chunks for c in chunk.choices if c.logprobs for item in c.logprobs.content]
    assert [item.token for item in pieces] == [item.token for item in content]


def test_completion_logprobs_have_the_legacy_shape(face: tuple[str, RunningProcess], client: openai.OpenAI) -> None:
    answer = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=4, logprobs=2)
    logprobs = answer.choices[0].logprobs
    assert "".join(logprobs.tokens) == answer.choices[0].text
    assert len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == len(logprobs.text_offset) == 4
    assert all(len(top) <= 2 and logprobs.tokens[i] in top for i, top in enumerate(logprobs.top_logprobs))
    if face[0] == "vllm":
        assert logprobs.text_offset == [sum(map(len, logprobs.tokens[:i])) for i in range(4)]
    else:
        assert logprobs.text_offset == [-1] * 4  # SGLang does not track offsets

    chunks = list(client.completions.create(model=MODEL, prompt="Once upon", max_tokens=4, logprobs=2, stream=True))
    tokens = [token for chunk in chunks for c in chunk.choices if c.logprobs for token in c.logprobs.tokens]
    assert tokens == logprobs.tokens


def test_response_format_gives_json_and_json_matching_the_schema(client: openai.OpenAI) -> None:
    whole = chat(client, response_format={"type": "json_object"})
    assert isinstance(json.loads(whole.choices[0].message.content), dict)
    assert whole.choices[0].finish_reason == "stop"
    schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    for seed in (1, 2, 3):
        answer = chat(client, response_format=schema, seed=seed)
        jsonschema.validate(json.loads(answer.choices[0].message.content), ANSWER)
    chunks = streamed(client, response_format=schema, seed=3)
    text = "".join(c.delta.content or "" for chunk in chunks for c in chunk.choices)
    assert text == answer.choices[0].message.content
    assert len([chunk for chunk in chunks if chunk.choices and chunk.choices[0].delta.content]) > 3


def test_a_stop_string_ends_the_text_before_it(face: tuple[str, RunningProcess], client: openai.OpenAI) -> None:
    engine = face[0]
    free = chat(client, max_tokens=40, seed=5).choices[0].message.content
    word = free.split()[len(free.split()) // 2]
    stop = " " + word
    cut = free[: free.index(stop)]
    choice = chat(client, max_tokens=40, seed=5, stop=[stop, "never-there"]).choices[0]
    assert choice.message.content == cut and choice.finish_reason == "stop"
    detail = (choice.model_extra or {}).get("matched_stop" if engine == "sglang" else "stop_reason")
    assert detail == stop

    whole = chat(client, max_tokens=40, seed=5, stop=stop)
    chunks = streamed(client, max_tokens=40, seed=5, stop=stop)
    assert "".join(c.delta.content or "" for chunk in chunks for c in chunk.choices) == cut
    last = [c for chunk in chunks for c in chunk.choices if c.finish_reason][-1]
    assert last.finish_reason == "stop"
    assert (last.model_extra or {}).get("matched_stop" if engine == "sglang" else "stop_reason") == stop
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens < 40

    text = client.completions.create(model=MODEL, prompt="Once", max_tokens=30, seed=5).choices[0].text
    stop_word = " " + text.split()[len(text.split()) // 2]
    done = client.completions.create(model=MODEL, prompt="Once", max_tokens=30, seed=5, stop=stop_word).choices[0]
    assert done.text == text[: text.index(stop_word)] and done.finish_reason == "stop"


def test_bad_tool_choices_are_refused_in_the_engines_words(face: tuple[str, RunningProcess]) -> None:
    engine, sim = face
    body = {
        "model": MODEL,
        "messages": USER,
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "nope"}},
    }
    response = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400
    if engine == "sglang":
        assert response.json()["message"] == "Tool 'nope' not found in tools list."
    else:
        assert "does not match any of the specified `tools`" in response.json()["error"]["message"]


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    """The gateway over one simulated replica of each engine that parses tool calls."""
    engine = request.param
    log_dir = tmp_path_factory.mktemp(f"features-gateway-{engine}")
    flags = ("--engine", engine, "--tool-call-parser", PARSER[engine], "--enable-auto-tool-choice")

    def name_the_engine(config: dict[str, Any]) -> None:
        config["pools"][0]["engine"] = engine

    yield from gateway_over_one_replica(log_dir, name_the_engine, "--time-scale", "0.02", *flags)


def test_the_features_pass_through_the_gateway_intact(gateway: RunningProcess) -> None:
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0) as sdk:
        ask = sdk.chat.completions.create
        two = ask(model="chat", messages=USER, max_tokens=4, n=2)  # type: ignore[call-overload]
        assert [c.index for c in two.choices] == [0, 1] and two.usage.completion_tokens == 8

        called = ask(model="chat", messages=USER, tools=TOOLS, tool_choice="required", seed=2)  # type: ignore[call-overload]
        assert called.choices[0].finish_reason == "tool_calls"
        _check_call(called.choices[0].message.tool_calls[0])

        chunks = list(ask(model="chat", messages=USER, tools=TOOLS, tool_choice="required", seed=2, stream=True))  # type: ignore[call-overload]
        deltas = [call for chunk in chunks for c in chunk.choices for call in c.delta.tool_calls or []]
        assert deltas[0].id and deltas[0].function.name == called.choices[0].message.tool_calls[0].function.name
        assert (
            "".join(d.function.arguments or "" for d in deltas)
            == called.choices[0].message.tool_calls[0].function.arguments
        )

        scored = ask(model="chat", messages=USER, max_tokens=3, logprobs=True, top_logprobs=2)  # type: ignore[call-overload]
        assert len(scored.choices[0].logprobs.content) == 3
        assert all(len(item.top_logprobs) == 2 for item in scored.choices[0].logprobs.content)

        schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
        shaped = ask(model="chat", messages=USER, response_format=schema)  # type: ignore[call-overload]
        jsonschema.validate(json.loads(shaped.choices[0].message.content), ANSWER)

        stopped = ask(model="chat", messages=USER, max_tokens=40, seed=5, stop=[" the", " a"])  # type: ignore[call-overload]
        assert stopped.choices[0].finish_reason in ("stop", "length")
        assert " the" not in stopped.choices[0].message.content


SCHEMAS_TO_FILL = [
    ANSWER,
    WEATHER["function"]["parameters"],
    {
        "type": "object",
        "properties": {
            "id": {"const": "fixed"},
            "when": {"type": ["string", "null"]},
            "either": {"anyOf": [{"type": "integer", "minimum": 5, "maximum": 9}, {"type": "string"}]},
            "nested": {
                "type": "object",
                "properties": {"deep": {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 4}},
                "required": ["deep"],
            },
            "short": {"type": "string", "maxLength": 4},
        },
        "required": ["id", "when", "either", "nested", "short"],
    },
]


@pytest.mark.parametrize("schema", SCHEMAS_TO_FILL, ids=["answer", "weather", "nested"])
def test_json_written_for_a_schema_always_matches_it(client: openai.OpenAI, schema: dict[str, Any]) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    texts = set()
    for seed in range(12):
        text = chat(client, response_format=response_format, seed=seed).choices[0].message.content
        jsonschema.validate(json.loads(text), schema)
        texts.add(text)
    assert len(texts) > 1  # the seed picks the values
