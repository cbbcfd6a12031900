"""Stored responses under an attacker's and an operator's hands: one tenant's key never reaches another tenant's
stored response whatever id it sends, and what a gateway accepted and stored is still there after it restarts.
Real gateway processes over a simulated replica, driven by the official ``openai`` SDK."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.gateway import TENANT_KEY, gateway_config, start_gateway, start_replica
from tests.support.procs import RunningProcess
from tests.support.redis_server import redis_url
from tests.support.sdk_warnings import FAIL_ON_SDK_WARNINGS

FAST = ("--time-scale", "0.02")
PREFIX_KEY = "sk-test-team"
NESTED_KEY = "sk-test-team-nested"

# The SDK reads every answer without a warning.
pytestmark = FAIL_ON_SDK_WARNINGS


def sdk(gateway: RunningProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    running = start_replica(tmp_path_factory.mktemp("probe-replica"), *FAST)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def nested_tenants(tmp_path_factory: pytest.TempPathFactory, replica: RunningProcess) -> Iterator[RunningProcess]:
    """A gateway storing responses in Redis for two tenants, one named as the other plus ``:b`` (names may hold
    colons, as Redis keys do)."""
    log_dir = tmp_path_factory.mktemp("nested-tenants")
    with redis_url(log_dir) as url:
        config = gateway_config([replica.url], state={"redis_url": url, "key_prefix": "probe-nested"})
        config["tenants"] = [
            {"name": "team", "keys": [PREFIX_KEY]},
            {"name": "team:b", "keys": [NESTED_KEY]},
        ]
        gateway = start_gateway(config, log_dir)
        try:
            yield gateway
        finally:
            gateway.stop()


def test_an_id_with_a_colon_does_not_reach_the_stored_response_of_a_tenant_named_with_one(
    nested_tenants: RunningProcess,
) -> None:
    victim = sdk(nested_tenants, NESTED_KEY).responses.create(
        model="chat", input="The code is 4711.", max_output_tokens=4
    )
    attacker = sdk(nested_tenants, PREFIX_KEY)
    forged = f"b:{victim.id}"

    with pytest.raises(openai.NotFoundError):
        attacker.responses.retrieve(forged)
    with pytest.raises(openai.NotFoundError):
        attacker.responses.create(model="chat", previous_response_id=forged, input="Repeat the code.")
    with pytest.raises(openai.NotFoundError):
        attacker.responses.delete(forged)
    # the index of the victim's stored responses is no response either: 404, not a store failure
    answer = httpx.get(nested_tenants.url + "/v1/responses/b", headers={"authorization": f"Bearer {PREFIX_KEY}"})
    assert answer.status_code == 404, answer.text

    assert sdk(nested_tenants, NESTED_KEY).responses.retrieve(victim.id).id == victim.id


@contextlib.contextmanager
def gateway_on(config: dict[str, Any], log_dir: Path) -> Iterator[RunningProcess]:
    gateway = start_gateway(config, log_dir)
    try:
        yield gateway
    finally:
        gateway.stop()


def test_stored_responses_survive_a_restart_of_a_gateway_without_redis(tmp_path: Path, replica: RunningProcess) -> None:
    config = gateway_config([replica.url], state={"data_dir": str(tmp_path / "data")})
    with gateway_on(config, tmp_path) as gateway:
        client = sdk(gateway, TENANT_KEY)
        first = client.responses.create(model="chat", input="Remember the number 7.", max_output_tokens=6)
        dropped = client.responses.create(model="chat", input="Forget this one.", max_output_tokens=2)
        client.responses.delete(dropped.id)
    stored = tmp_path / "data" / "responses.sqlite3"
    assert stored.stat().st_mode & 0o077 == 0  # the tenants' conversations: the gateway's user's only

    with gateway_on(config, tmp_path) as restarted:
        client = sdk(restarted, TENANT_KEY)
        kept = client.responses.retrieve(first.id)
        assert kept.model_dump() == first.model_dump()
        second = client.responses.create(
            model="chat", previous_response_id=first.id, input="Which number?", max_output_tokens=6
        )
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(dropped.id)
        conversation = [
            {"role": "user", "content": "Remember the number 7."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "Which number?"},
        ]
        expected = client.chat.completions.create(model="chat", messages=conversation, max_tokens=6)  # type: ignore[arg-type]
        assert second.output_text == expected.choices[0].message.content
