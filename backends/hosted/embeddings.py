"""Send one OpenAI-format embeddings request to a hosted model through litellm's ``aembedding``.

As :mod:`backends.hosted.client` does for chat: only OpenAI's embedding fields from the client (never litellm's
control arguments), credentials from the config, no retries (the gateway decides), a silence timeout, the usage
and its cost at the model's input price, and errors reduced to a few kinds. The answer is OpenAI's
``{"object": "list", "data": [...], "model", "usage"}``, its vectors as the provider sent them (floats, or base64
when the client asked for that).

Importing this module imports litellm (seconds): do it at start-up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from spillgate.backends.hosted.errors import classify, silence
from spillgate.backends.hosted.model import HostedModel
from spillgate.backends.hosted.runtime import litellm

EMBEDDING_REQUEST_FIELDS = frozenset({"input", "dimensions", "encoding_format", "user"})
"""OpenAI embedding fields a client may set; anything else in the body is dropped."""


@dataclass(frozen=True)
class HostedEmbeddings:
    """A whole embeddings answer, ready to send, with its prompt tokens and cost (None when not known)."""

    body: bytes
    prompt_tokens: int | None
    cost_usd: float | None


def embedding_arguments(model: HostedModel, payload: Mapping[str, Any]) -> dict[str, Any]:
    """litellm.aembedding's arguments: the client's OpenAI fields, then the config's, then fixed ones."""
    arguments = {key: value for key, value in payload.items() if key in EMBEDDING_REQUEST_FIELDS}
    arguments.update(model.params)
    arguments.update(
        model=model.litellm_model,
        api_base=model.api_base,
        api_key=model.api_key,
        timeout=model.timeout_s,
        num_retries=0,
        max_retries=0,
        drop_params=True,
    )
    return arguments


async def embed(
    model: HostedModel, payload: Mapping[str, Any], *, headers: Mapping[str, str] | None = None
) -> HostedEmbeddings:
    """Send ``payload`` (an OpenAI embeddings body) to ``model``; raises HostedError. ``headers`` go to the
    provider too: the gateway's own (W3C ``traceparent``), never a client's."""
    arguments = embedding_arguments(model, payload)
    if headers:
        arguments["extra_headers"] = dict(headers)
    try:
        async with asyncio.timeout(model.timeout_s):
            result = await litellm.aembedding(**arguments)
    except TimeoutError:
        raise silence(model=model.name, timeout_s=model.timeout_s, streamed_anything=False) from None
    except Exception as exc:
        raise classify(exc, model=model.name, secrets=model.secrets(), streamed_anything=False) from None
    # base64 vectors are strings where litellm's model declares floats: not worth a warning
    raw = result.model_dump(warnings=False)
    answer = embeddings_json(raw)
    prompt = answer["usage"]["prompt_tokens"] if "usage" in answer else None
    cost = None
    if prompt is not None and model.price is not None:
        cost = model.price.cost(prompt, 0)
    return HostedEmbeddings(body=orjson.dumps(answer), prompt_tokens=prompt, cost_usd=cost)


def embeddings_json(raw: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's embeddings list from litellm's EmbeddingResponse (``model_dump()``): its fields only."""
    data = [
        {"object": "embedding", "index": item.get("index", index), "embedding": item.get("embedding")}
        for index, item in enumerate(raw.get("data") or ())
        if isinstance(item, dict)
    ]
    answer: dict[str, Any] = {"object": "list", "data": data, "model": raw.get("model") or ""}
    usage = raw.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
        prompt = usage["prompt_tokens"]
        answer["usage"] = {"prompt_tokens": prompt, "total_tokens": usage.get("total_tokens") or prompt}
    return answer
