"""Stored responses across gateway processes (Redis) and through ``GET``/``DELETE /v1/responses/{id}``, with the
official ``openai`` SDK against real gateways over a simulated replica."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from tests.support.gateway import OTHER_KEY, TENANT_KEY, gateway_config, start_gateway, start_replica
from tests.support.procs import RunningProcess, free_port
from tests.support.redis_server import redis_url as private_redis
from tests.support.sdk_warnings import FAIL_ON_SDK_WARNINGS

FAST = ("--time-scale", "0.02")


@dataclass
class Shared:
    """Two gateway processes sharing one Redis, and the way to stop that Redis."""

    first: RunningProcess
    second: RunningProcess
    stop_redis: contextlib.ExitStack


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    log_dir = tmp_path_factory.mktemp("responses-redis")
    with contextlib.ExitStack() as stack:
        replica = start_replica(log_dir, *FAST)
        stack.callback(replica.stop)
        redis_stack = contextlib.ExitStack()
        stack.callback(redis_stack.close)
        url = redis_stack.enter_context(private_redis(log_dir, port=free_port()))  # its own, for the outage test
        config = gateway_config([replica.url], state={"redis_url": url, "key_prefix": "responses-test"})
        first = start_gateway(config, log_dir)
        stack.callback(first.stop)
        second = start_gateway(config, log_dir)
        stack.callback(second.stop)
        yield Shared(first, second, redis_stack)


# The SDK reads every answer without a warning.
pytestmark = FAIL_ON_SDK_WARNINGS


def sdk(gateway: RunningProcess, key: str = TENANT_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)


def served_retrieve(gateway: RunningProcess) -> bool:
    """Whether the gateway serves ``GET /v1/responses/{id}`` (its router is included in the app)."""
    answer = httpx.get(gateway.url + "/v1/responses/resp_probe", headers={"authorization": f"Bearer {TENANT_KEY}"})
    return answer.json()["error"]["code"] != "unsupported_endpoint"


def test_a_response_stored_by_one_process_is_chained_by_another(shared: Shared) -> None:
    first = sdk(shared.first).responses.create(model="chat", input="Remember the number 7.", max_output_tokens=6)
    second = sdk(shared.second).responses.create(
        model="chat", previous_response_id=first.id, input="Which number?", max_output_tokens=6
    )

    conversation = [
        {"role": "user", "content": "Remember the number 7."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Which number?"},
    ]
    expected = sdk(shared.first).chat.completions.create(model="chat", messages=conversation, max_tokens=6)  # type: ignore[arg-type]
    assert second.output_text == expected.choices[0].message.content
    # and back: the first process continues what the second stored
    sdk(shared.first).responses.create(model="chat", previous_response_id=second.id, input="More.", max_output_tokens=2)


def test_tenants_do_not_share_stored_responses_in_redis(shared: Shared) -> None:
    mine = sdk(shared.first).responses.create(model="chat-rr", input="Private.", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        sdk(shared.second, OTHER_KEY).responses.create(model="chat-rr", previous_response_id=mine.id, input="Show me.")


def test_retrieve_and_delete_a_stored_response(shared: Shared) -> None:
    if not served_retrieve(shared.first):
        pytest.skip("GET /v1/responses/{id} is not routed by this app yet")
    created = sdk(shared.first).responses.create(model="chat", input="Keep me.", max_output_tokens=3)

    fetched = sdk(shared.second).responses.retrieve(created.id)
    assert fetched.id == created.id and fetched.output_text == created.output_text
    assert fetched.usage is not None and fetched.status == created.status
    with pytest.raises(openai.NotFoundError):
        sdk(shared.second, OTHER_KEY).responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        sdk(shared.second, OTHER_KEY).responses.delete(created.id)

    sdk(shared.second).responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        sdk(shared.first).responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        sdk(shared.first).responses.create(model="chat", previous_response_id=created.id, input="Gone?")


def test_without_redis_chaining_is_503_and_plain_requests_are_served(shared: Shared) -> None:
    """Runs last in this module: it stops the Redis the gateways share."""
    stored = sdk(shared.first).responses.create(model="chat", input="Before the outage.", max_output_tokens=2)
    shared.stop_redis.close()

    with pytest.raises(openai.InternalServerError) as caught:
        sdk(shared.second).responses.create(model="chat", previous_response_id=stored.id, input="After.")
    assert caught.value.status_code == 503
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["code"] == "response_store_unavailable" and error["param"] == "previous_response_id"

    plain = sdk(shared.second).responses.create(model="chat", input="Still here?", max_output_tokens=2)
    assert plain.status == "incomplete" and plain.output_text
    if served_retrieve(shared.first):
        answer = httpx.get(
            shared.first.url + f"/v1/responses/{stored.id}", headers={"authorization": f"Bearer {TENANT_KEY}"}
        )
        assert answer.status_code == 503
        assert answer.json()["error"]["code"] == "response_store_unavailable"
