"""The official ``openai`` SDK's Responses client against both simulated engines: answers whole and streamed parse
without a warning, replies are deterministic, and a stored response is continued and retrieved.

Both simulators keep responses, as the engines do when told to (SGLang ``--enable-response-store``, vLLM
``VLLM_ENABLE_RESPONSES_API_STORE=1``); without that they refuse or ignore it (``test_responses_fixtures.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support.procs import RunningProcess, free_port, start_spillgate
from tests.support.sdk_warnings import FAIL_ON_SDK_WARNINGS

ENGINES = ("sglang", "vllm")
MODEL = "tiny"

# The SDK reads every answer without a warning.
pytestmark = FAIL_ON_SDK_WARNINGS


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningProcess]]:
    log_dir = tmp_path_factory.mktemp("responses-sdk")
    started: dict[str, RunningProcess] = {}
    try:
        for engine in ENGINES:
            port = free_port()
            args = ["sim-replica", "--port", str(port), "--time-scale", "0.02", "--model-name", MODEL]
            args += ["--engine", engine, *(["--enable-response-store"] if engine == "sglang" else [])]
            env = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
            ready = "/health" if engine == "vllm" else "/ready"
            started[engine] = start_spillgate(args, port=port, log_dir=log_dir, ready_path=ready, env=env)
        yield started
    finally:
        for proc in started.values():
            proc.stop()


@pytest.fixture(params=ENGINES)
def client(request: pytest.FixtureRequest, sims: dict[str, RunningProcess]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=sims[request.param].url + "/v1", api_key="none", max_retries=0) as sdk:
        yield sdk


def test_a_whole_response_parses(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="Name three prime numbers.", max_output_tokens=12)

    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text.strip()
    assert response.usage is not None
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert response.usage.input_tokens_details.cached_tokens >= 0


def test_a_streamed_response_parses_event_by_event(client: openai.OpenAI) -> None:
    stream = client.responses.create(model=MODEL, input="Count to five.", max_output_tokens=12, stream=True)
    events = list(stream)

    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.incomplete", "response.completed")  # SGLang names the status, vLLM does not
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert text and final.output_text == text
    assert final.status == "incomplete"


def test_the_stream_helper_assembles_the_same_response(client: openai.OpenAI) -> None:
    whole = client.responses.create(model=MODEL, input="Describe the sea.")
    with client.responses.stream(model=MODEL, input="Describe the sea.") as stream:
        streamed = stream.get_final_response()

    assert whole.status == streamed.status == "completed"  # the reply ended on its own
    assert streamed.output_text == whole.output_text


def test_the_stream_helper_finds_no_end_in_sglangs_incomplete_stream(sims: dict[str, RunningProcess]) -> None:
    """SGLang ends a stream cut by ``max_output_tokens`` with ``response.incomplete`` (as the captured real stream
    does), which the SDK's helper does not take for the end (iterating the events works: above)."""
    base_url = sims["sglang"].url + "/v1"
    with (
        openai.OpenAI(base_url=base_url, api_key="none", max_retries=0) as sdk,
        sdk.responses.stream(model=MODEL, input="Describe the sea.", max_output_tokens=10) as stream,
        pytest.raises(RuntimeError, match=r"response\.completed"),
    ):
        stream.get_final_response()


def test_replies_are_deterministic(client: openai.OpenAI) -> None:
    first, second = (
        client.responses.create(model=MODEL, input="Pick a colour.", instructions="Be brief.", max_output_tokens=8)
        for _ in range(2)
    )

    assert first.output_text == second.output_text
    assert first.id != second.id


def test_a_stored_response_is_continued_and_retrieved(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL, input="Remember the number 7.", max_output_tokens=8)
    second = client.responses.create(
        model=MODEL, input="Which number?", previous_response_id=first.id, max_output_tokens=8
    )
    retrieved = client.responses.retrieve(first.id)

    assert second.previous_response_id == first.id
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0  # the stored turn is the new prompt's prefix
    assert retrieved.id == first.id and retrieved.output_text == first.output_text


def test_an_unknown_previous_response_is_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_unknown", max_output_tokens=4)
