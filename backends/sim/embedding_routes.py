"""``POST /v1/embeddings`` on a simulated replica, answered as SGLang (``--is-embedding``) or vLLM (a pooling model)
answers it.

An embedding is a unit vector drawn from a hash of the replica's ``--seed`` and the input's token ids: the same
text always gives the same vector on every replica with that seed, different text another. Its size is the
preset model's hidden size; ``dimensions`` keeps its first components, normalised again (as a Matryoshka model
does). Inputs are a string, a list of strings, a list of token ids or a list of such lists; ``usage`` counts
their tokens with the simulator's tokenizer (a string gets the BOS token, as the engines' tokenizers add it).
``encoding_format`` is ``float`` or ``base64`` (little-endian float32, as OpenAI sends it). The time taken is
one prefill pass over every input; embeddings do not go through the scheduler, so they show in no load figure.
Refusals have each engine's shape: SGLang's flat 400, vLLM's ``{"error": {...}}`` naming the parameter. SGLang
names the model by its path in the answer (as real SGLang does), vLLM by its served name. Unlike a real embedding
model that is not Matryoshka-trained, ``dimensions`` is served rather than refused.
"""

from __future__ import annotations

import base64
import math
import random
import struct
import time
import uuid
from typing import Any

import orjson
import xxhash
from fastapi import APIRouter, Request
from fastapi.responses import Response

from spillgate.backends.sim.errors import error_response
from spillgate.backends.sim.replica import Replica, ReplicaDep
from spillgate.backends.sim.timing import prefill_seconds
from spillgate.backends.sim.tokenizer import BEGIN_OF_TEXT, VOCAB_SIZE
from spillgate.backends.sim.wire import OrjsonResponse

router = APIRouter()

ENCODINGS = ("float", "base64")


class EmbeddingRefused(ValueError):
    """A request the engine refuses: its message, and the parameter vLLM names."""

    def __init__(self, message: str, param: str | None = None, value: object = None, *, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.value, self.status = param, value, status

    def response(self, engine: str) -> Response:
        if engine != "vllm":
            return error_response(str(self), "BadRequestError" if self.status == 400 else "NotFoundError", self.status)
        named = self.param and self.status == 400  # vLLM's 404 names the model in its text already
        message = str(self) + (f" (parameter={self.param}, value={self.value})" if named else "")
        kind = "BadRequestError" if self.status == 400 else "NotFoundError"
        body = {"error": {"message": message, "type": kind, "param": self.param, "code": self.status}}
        return OrjsonResponse(body, status_code=self.status)


@router.post("/v1/embeddings")
async def embeddings(request: Request, replica: ReplicaDep) -> Response:
    config = replica.config
    try:
        payload = _payload(request, await request.body(), config.engine)
        _check_model(replica, payload)
        inputs = token_inputs(replica, payload.get("input"))
        _check_lengths(replica, inputs)
        encoding = _encoding(payload.get("encoding_format"))
        size = _dimensions(payload.get("dimensions"), config.preset_spec.model.hidden_size)
    except EmbeddingRefused as refused:
        return refused.response(config.engine)
    await replica.clock.sleep(prefill_seconds(config.preset_spec, [(len(ids), 0) for ids in inputs]))
    data = [
        {"object": "embedding", "index": index, "embedding": encode(embedding(config.seed, ids, size), encoding)}
        for index, ids in enumerate(inputs)
    ]
    prompt = sum(len(ids) for ids in inputs)
    usage = {"prompt_tokens": prompt, "total_tokens": prompt, "completion_tokens": 0, "prompt_tokens_details": None}
    if config.engine == "vllm":
        body: dict[str, Any] = {
            "id": f"embd-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": config.served_model_name,
            "data": data,
            "usage": usage,
        }
    else:
        # SGLang names the model by its path, whatever the request or --served-model-name said.
        body = {"data": data, "model": config.model_path, "object": "list"}
        body["usage"] = {**usage, "reasoning_tokens": 0, "completion_tokens_details": None}
    return OrjsonResponse(body)


def _payload(request: Request, raw: bytes, engine: str) -> dict[str, Any]:
    """The JSON body; SGLang also wants it declared as JSON."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if engine != "vllm" and media_type != "application/json":
        raise EmbeddingRefused(
            "1 validation error(s): header.content-type: Unsupported Media Type: Only 'application/json' is allowed"
        )
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise EmbeddingRefused("Invalid JSON body.") from None
    if not isinstance(payload, dict):
        raise EmbeddingRefused("The request body must be a JSON object.")
    if "input" not in payload:
        raise EmbeddingRefused("1 validation error(s): body.input: Field required", "input", None)
    return payload


def _check_model(replica: Replica, payload: dict[str, Any]) -> None:
    """vLLM answers 404 for a model it does not serve; SGLang serves its one model whatever is named."""
    model, served = payload.get("model"), replica.config.served_model_name
    if replica.config.engine == "vllm" and model not in (None, served):
        raise EmbeddingRefused(
            f"The model `{model}` does not exist. Valid aliases: {served}.", "model", model, status=404
        )


def token_inputs(replica: Replica, value: object) -> list[list[int]]:
    """Each input's token ids, with SGLang's checks and messages (``serving_embedding.py: _validate_request``)."""
    if value is None or value == "" or value == []:
        raise EmbeddingRefused("Input cannot be empty", "input", value)
    if isinstance(value, str):
        if not value.strip():
            raise EmbeddingRefused("Input cannot be empty or whitespace only", "input", value)
        return [_text_ids(replica, value)]
    if not isinstance(value, list):
        raise EmbeddingRefused("Input must be a string, a list of strings or a list of token ids", "input", value)
    first = value[0]
    if isinstance(first, str):
        for index, item in enumerate(value):
            if not isinstance(item, str):
                raise EmbeddingRefused("All items in input list must be strings", "input", value)
            if not item.strip():
                raise EmbeddingRefused(f"Input at index {index} cannot be empty or whitespace only", "input", item)
        return [_text_ids(replica, item) for item in value]
    if _is_int(first):
        for index, item in enumerate(value):
            if not _is_int(item):
                raise EmbeddingRefused("All items in input list must be integers", "input", value)
            if item < 0:
                raise EmbeddingRefused(f"Token ID at index {index} must be non-negative", "input", item)
        return [_checked_ids(value)]
    if isinstance(first, list):
        for index, item in enumerate(value):
            if not isinstance(item, list):
                raise EmbeddingRefused(f"Input at index {index} must be a list", "input", item)
            if not item:
                raise EmbeddingRefused(f"Input at index {index} cannot be empty", "input", item)
            if not all(_is_int(token) for token in item):
                raise EmbeddingRefused(f"Input at index {index} must contain only integers", "input", item)
            if any(token < 0 for token in item):
                raise EmbeddingRefused(f"Input at index {index} contains negative token IDs", "input", item)
        return [_checked_ids(item) for item in value]
    raise EmbeddingRefused("Input must be a string, a list of strings or a list of token ids", "input", first)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text_ids(replica: Replica, text: str) -> list[int]:
    return [BEGIN_OF_TEXT, *replica.tokenizer.encode(text)]


def _checked_ids(ids: list[int]) -> list[int]:
    for token in ids:
        if token >= VOCAB_SIZE:
            raise EmbeddingRefused(
                f"Token id {token} is out of the vocabulary range [0, {VOCAB_SIZE}).", "input", token
            )
    return list(ids)


def _check_lengths(replica: Replica, inputs: list[list[int]]) -> None:
    """An input as long as the context is refused, in each engine's words."""
    context = replica.config.context_length
    for ids in inputs:
        if len(ids) < context:
            continue
        if replica.config.engine == "vllm":
            raise EmbeddingRefused(
                f"This model's maximum context length is {context} tokens. However, your prompt contains at least "
                f"{context + 1} input tokens, which exceeds this limit even without any output tokens. Please "
                "reduce the length of the input prompt.",
                "input_tokens",
                context + 1,
            )
        raise EmbeddingRefused(
            f"The input ({len(ids)} tokens) is longer than the model's context length ({context} tokens)."
        )


def _encoding(value: object) -> str:
    if value is None:
        return "float"
    if value not in ENCODINGS:
        raise EmbeddingRefused(
            f"encoding_format must be one of {', '.join(repr(e) for e in ENCODINGS)}", "encoding_format", value
        )
    return str(value)


def _dimensions(value: object, hidden_size: int) -> int:
    if value is None:
        return hidden_size
    if not _is_int(value):
        raise EmbeddingRefused("dimensions must be an integer", "dimensions", value)
    assert isinstance(value, int)
    if value < 1:
        raise EmbeddingRefused("Dimensions must be greater than 0", "dimensions", value)
    if value > hidden_size:
        raise EmbeddingRefused(
            f"Dimensions must be at most the model's hidden size, {hidden_size}", "dimensions", value
        )
    return value


def embedding(seed: int, ids: list[int], size: int) -> list[float]:
    """The unit vector of ``ids`` under ``seed``, cut to its first ``size`` components and normalised again."""
    digest = xxhash.xxh3_64_intdigest(struct.pack(f"<{len(ids)}I", *ids), seed)
    draw = random.Random(digest)
    vector = [draw.gauss(0.0, 1.0) for _ in range(size)]
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


def encode(vector: list[float], encoding: str) -> list[float] | str:
    """``float``: the numbers; ``base64``: their little-endian float32 bytes, as OpenAI and vLLM send them."""
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector
