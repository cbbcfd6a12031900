"""Stored responses under an attacker's hands: one tenant's key never reaches another tenant's stored response
whatever id it sends. Real gateway processes over a simulated replica, driven by the official ``openai`` SDK."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support.gateway import gateway_config, start_gateway, start_replica
from tests.support.procs import RunningProcess
from tests.support.redis_server import redis_url

FAST = ("--time-scale", "0.02")
PREFIX_KEY = "sk-test-team"
NESTED_KEY = "sk-test-team-nested"

pytestmark = pytest.mark.filterwarnings("error")  # the SDK reads every answer without a warning


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
