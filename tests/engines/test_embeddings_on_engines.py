"""``/v1/embeddings`` through the gateway in each world: real SGLang started with ``--is-embedding``, real vLLM with
``--runner pooling`` (the tiny random model as an embedding model), and the simulator with either face.

The same test body runs everywhere: the gateway relays the replica's answer and books the usage the replica
reported, whatever the engine.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.engines.worlds import WORLDS, World, make_world
from tests.support.gateway import TENANT_KEY, gateway_config, start_gateway
from tests.support.procs import RunningProcess

EMBEDDING_FLAGS = {"sglang": ("--is-embedding",), "vllm": ("--runner", "pooling")}
"""What makes a real engine serve embeddings; the simulator serves them as it is."""


@pytest.fixture(scope="module", params=WORLDS)
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    yield from make_world(request.param)


@pytest.fixture(scope="module")
def setup(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningProcess, RunningProcess]]:
    """One embedding replica of the world, and a gateway whose route ``embed`` is it (``task: embed``)."""
    log_dir = tmp_path_factory.mktemp(f"{world.name}-embeddings")
    flags = EMBEDDING_FLAGS[world.engine] if world.real else ()
    replica = world.replica(log_dir, *flags)
    config = gateway_config([])
    config["pools"] = [world.pool([replica.url], task="embed")]
    config["routes"] = [{"name": "embed", "targets": ["pool"], "policy": "least_load"}]
    config["tenants"] = [{"name": "tenant-a", "keys": [TENANT_KEY]}]
    config["health"]["generation_check_s"] = 0
    gateway = start_gateway(config, log_dir)
    try:
        yield gateway, replica
    finally:
        gateway.stop()


def test_the_sdk_gets_the_replicas_embeddings_and_usage_through_the_gateway(
    setup: tuple[RunningProcess, RunningProcess],
) -> None:
    gateway, replica = setup
    sdk = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    texts = ["hello world", "the cache of a model"]
    floats = sdk.embeddings.create(model="embed", input=texts, encoding_format="float")
    assert [item.index for item in floats.data] == [0, 1]
    size = len(floats.data[0].embedding)
    assert size > 0 and len(floats.data[1].embedding) == size
    direct = httpx.post(
        replica.url + "/v1/embeddings", json={"model": "tiny", "input": texts, "encoding_format": "float"}, timeout=60
    ).json()
    assert floats.usage.prompt_tokens == direct["usage"]["prompt_tokens"] > 0
    assert floats.data[0].embedding == pytest.approx(direct["data"][0]["embedding"], abs=1e-5)
    raw = sdk.embeddings.create(model="embed", input="hello world", encoding_format="base64")
    assert isinstance(raw.data[0].embedding, str) and len(base64.b64decode(raw.data[0].embedding)) == 4 * size
    decoded = sdk.embeddings.create(model="embed", input="hello world")
    assert decoded.data[0].embedding == pytest.approx(floats.data[0].embedding, abs=1e-5)


def test_a_chat_request_to_the_embeddings_route_is_refused_before_the_replica(
    setup: tuple[RunningProcess, RunningProcess],
) -> None:
    gateway, _ = setup
    sdk = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model="embed", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert refused.value.body["param"] == "model" and refused.value.body["code"] == "wrong_model_task"
