"""The simulated replicas' ``/v1/embeddings``: the official openai SDK against both faces, and their refusals."""

from __future__ import annotations

import base64
import math
import struct

import httpx
import openai
import pytest

from spillgate.backends.sim.tokenizer import BEGIN_OF_TEXT, Tokenizer
from tests.sim.conftest import StartReplica
from tests.support.procs import RunningProcess

HIDDEN_SIZE = 4096
"""Llama-3.1-8B's, the default preset's model."""
ENGINES = ("sglang", "vllm")


@pytest.fixture(scope="module")
def faces(start_sim: StartReplica) -> dict[str, RunningProcess]:
    """One replica per engine face (seed 0), plus an SGLang one with another seed."""
    return {
        "sglang": start_sim("sim-replica", "--model-name", "embedder", "--time-scale", "0.05"),
        "vllm": start_sim("sim-replica", "--engine", "vllm", "--model-name", "embedder", "--time-scale", "0.05"),
        "seed-7": start_sim("sim-replica", "--model-name", "embedder", "--time-scale", "0.05", "--seed", "7"),
    }


def sdk(replica: RunningProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=replica.url + "/v1", api_key="unused", max_retries=0)


def tokens(text: str) -> int:
    return len(Tokenizer().encode(text)) + 1  # and the BOS token


@pytest.mark.parametrize("engine", ENGINES)
def test_the_sdk_gets_unit_vectors_of_the_models_size_with_usage(faces: dict[str, RunningProcess], engine: str) -> None:
    texts = ["the cache of a model", "a query to serve"]
    answer = sdk(faces[engine]).embeddings.create(model="embedder", input=texts, encoding_format="float")
    assert answer.object == "list"
    # SGLang names its model by path (the preset's), vLLM by its served name.
    assert answer.model == {"sglang": "meta-llama/Llama-3.1-8B-Instruct", "vllm": "embedder"}[engine]
    assert [item.index for item in answer.data] == [0, 1]
    for item in answer.data:
        assert len(item.embedding) == HIDDEN_SIZE
        assert math.isclose(math.fsum(x * x for x in item.embedding), 1.0, rel_tol=1e-9)
    assert answer.data[0].embedding != answer.data[1].embedding
    assert answer.usage.prompt_tokens == sum(tokens(text) for text in texts)
    assert answer.usage.total_tokens == answer.usage.prompt_tokens


def test_the_same_text_gives_the_same_vector_by_seed_whatever_the_face(faces: dict[str, RunningProcess]) -> None:
    def vector(name: str) -> list[float]:
        return (
            sdk(faces[name])
            .embeddings.create(model="embedder", input="spill", encoding_format="float")
            .data[0]
            .embedding
        )

    assert vector("sglang") == vector("vllm") == vector("sglang")
    assert vector("seed-7") != vector("sglang")


@pytest.mark.parametrize("engine", ENGINES)
def test_base64_is_little_endian_float32_and_the_sdk_decodes_it_by_default(
    faces: dict[str, RunningProcess], engine: str
) -> None:
    client = sdk(faces[engine])
    floats = client.embeddings.create(model="embedder", input="one text", encoding_format="float").data[0].embedding
    raw = client.embeddings.create(model="embedder", input="one text", encoding_format="base64").data[0].embedding
    assert isinstance(raw, str)
    unpacked = struct.unpack(f"<{HIDDEN_SIZE}f", base64.b64decode(raw))
    assert unpacked == pytest.approx(floats, abs=1e-6)
    # Without encoding_format the SDK asks for base64 and hands back floats.
    default = client.embeddings.create(model="embedder", input="one text").data[0].embedding
    assert default == pytest.approx(floats, abs=1e-6)


@pytest.mark.parametrize("engine", ENGINES)
def test_token_ids_and_lists_of_them_are_embedded_as_given(faces: dict[str, RunningProcess], engine: str) -> None:
    client = sdk(faces[engine])
    ids = [BEGIN_OF_TEXT, *Tokenizer().encode("one text")]
    as_text = client.embeddings.create(model="embedder", input="one text", encoding_format="float")
    as_ids = client.embeddings.create(model="embedder", input=ids, encoding_format="float")
    assert as_ids.data[0].embedding == as_text.data[0].embedding
    assert as_ids.usage.prompt_tokens == len(ids)
    batch = client.embeddings.create(model="embedder", input=[ids, [5, 6, 7]], encoding_format="float")
    assert len(batch.data) == 2 and batch.data[0].embedding == as_text.data[0].embedding
    assert batch.usage.prompt_tokens == len(ids) + 3


@pytest.mark.parametrize("engine", ENGINES)
def test_dimensions_keep_the_first_components_normalised_again(faces: dict[str, RunningProcess], engine: str) -> None:
    client = sdk(faces[engine])
    full = client.embeddings.create(model="embedder", input="shard", encoding_format="float").data[0].embedding
    short = client.embeddings.create(model="embedder", input="shard", dimensions=8, encoding_format="float")
    cut = short.data[0].embedding
    assert len(cut) == 8
    norm = math.sqrt(math.fsum(x * x for x in full[:8]))
    assert cut == pytest.approx([x / norm for x in full[:8]], rel=1e-9)


REFUSED = [
    ({"input": ""}, "Input cannot be empty"),
    ({"input": "   "}, "Input cannot be empty or whitespace only"),
    ({"input": ["ok", 3]}, "All items in input list must be strings"),
    ({"input": [1, -2]}, "Token ID at index 1 must be non-negative"),
    ({"input": [[1], []]}, "Input at index 1 cannot be empty"),
    ({"input": "x", "encoding_format": "bytes"}, "encoding_format must be one of 'float', 'base64'"),
    ({"input": "x", "dimensions": 0}, "Dimensions must be greater than 0"),
    ({"input": "x", "dimensions": HIDDEN_SIZE + 1}, "Dimensions must be at most the model's hidden size"),
    ({}, "1 validation error(s): body.input: Field required"),
]


@pytest.mark.parametrize(("body", "message"), REFUSED)
def test_sglang_refuses_bad_input_with_its_flat_400(faces: dict[str, RunningProcess], body: dict, message: str) -> None:
    answer = httpx.post(faces["sglang"].url + "/v1/embeddings", json={"model": "embedder", **body}, timeout=10)
    assert answer.status_code == 400
    error = answer.json()
    assert error["object"] == "error" and error["code"] == 400
    assert error["message"].startswith(message)


@pytest.mark.parametrize(("body", "message"), REFUSED)
def test_vllm_refuses_bad_input_naming_the_parameter(
    faces: dict[str, RunningProcess], body: dict, message: str
) -> None:
    answer = httpx.post(faces["vllm"].url + "/v1/embeddings", json={"model": "embedder", **body}, timeout=10)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == 400 and error["type"] == "BadRequestError"
    assert error["message"].startswith(message)
    assert error["param"] in {"input", "encoding_format", "dimensions"}


def test_vllm_answers_404_for_another_model_and_both_refuse_an_input_longer_than_the_context(
    start_sim: StartReplica, faces: dict[str, RunningProcess]
) -> None:
    answer = httpx.post(faces["vllm"].url + "/v1/embeddings", json={"model": "other", "input": "x"}, timeout=10)
    assert answer.status_code == 404
    assert answer.json()["error"]["message"] == "The model `other` does not exist. Valid aliases: embedder."
    short = start_sim("sim-replica", "--model-name", "embedder", "--context-length", "16", "--time-scale", "0.05")
    long_input = list(range(100, 120))
    answer = httpx.post(short.url + "/v1/embeddings", json={"model": "embedder", "input": long_input}, timeout=10)
    assert answer.status_code == 400
    assert answer.json()["message"] == "The input (20 tokens) is longer than the model's context length (16 tokens)."
