"""Send one OpenAI-format chat request to a hosted model through litellm, streaming or not.

litellm speaks each provider's wire format (OpenAI, Anthropic Messages, Bedrock, ...) and answers in
OpenAI's; this module adds what a gateway needs around it: only OpenAI request fields from the client
(never litellm's control arguments such as ``api_base`` or ``api_key``), credentials from the config,
no retries (the gateway decides), a silence timeout, usage and cost, and errors reduced to a few kinds.

Importing this module imports litellm (seconds): do it at start-up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx
import orjson

from spillgate.backends.hosted.direct import answer, open_stream, relays_directly
from spillgate.backends.hosted.errors import classify, silence
from spillgate.backends.hosted.model import HostedModel
from spillgate.backends.hosted.openai_format import completion_json, usage_from
from spillgate.backends.hosted.response import HostedCompletion, cost_of
from spillgate.backends.hosted.runtime import litellm
from spillgate.backends.hosted.stream import HostedStream

# OpenAI chat-completion fields a client may set; anything else in the body is dropped, so a client
# can never steer litellm itself (api_base, api_key, extra_headers, mock_response, metadata, ...).
OPENAI_REQUEST_FIELDS = frozenset(
    {
        "messages",
        "temperature",
        "top_p",
        "n",
        "stop",
        "max_tokens",
        "max_completion_tokens",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "user",
        "seed",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "reasoning_effort",
        "modalities",
        "audio",
        "prediction",
        "service_tier",
        "web_search_options",
        "verbosity",
        "prompt_cache_key",
        "safety_identifier",
        "functions",
        "function_call",
    }
)


def request_arguments(model: HostedModel, payload: Mapping[str, Any]) -> dict[str, Any]:
    """litellm.acompletion's arguments: the client's OpenAI fields, then the config's, then fixed ones."""
    arguments = {key: value for key, value in payload.items() if key in OPENAI_REQUEST_FIELDS}
    arguments.update(model.params)
    stream = bool(payload.get("stream"))
    arguments.update(
        model=model.litellm_model,
        api_base=model.api_base,
        api_key=model.api_key,
        stream=stream,
        timeout=httpx.Timeout(model.timeout_s, connect=model.connect_timeout_s),
        num_retries=0,
        max_retries=0,
        drop_params=True,  # a parameter the provider lacks is dropped, not a 400
    )
    if stream:
        arguments["stream_options"] = {"include_usage": True}  # always: the cost needs it
    return arguments


def _wants_usage(payload: Mapping[str, Any]) -> bool:
    options = payload.get("stream_options")
    return isinstance(options, Mapping) and bool(options.get("include_usage"))


async def complete(
    model: HostedModel,
    payload: Mapping[str, Any],
    *,
    http: httpx.AsyncClient | None = None,
    headers: Mapping[str, str] | None = None,
) -> HostedCompletion | HostedStream:
    """Send ``payload`` (an OpenAI chat-completion body) to ``model``; raises HostedError. ``headers`` go to the
    provider too: the gateway's own (W3C ``traceparent``), never a client's.

    A streaming request returns as soon as the provider has answered with headers; the HostedStream
    then yields its events as they come (iterate it to the end or ``aclose()`` it). The cost is known
    only for a model with a ``price`` (``HostedModel.with_price()`` at config load). With ``http``, requests
    to OpenAI-compatible providers skip litellm (:mod:`backends.hosted.direct`).
    """
    arguments = request_arguments(model, payload)
    if headers:
        arguments["extra_headers"] = dict(headers)
    try:
        async with asyncio.timeout(model.timeout_s):
            if http is not None and relays_directly(model):
                if arguments["stream"]:
                    source = await open_stream(http, model, arguments)
                    return HostedStream(model, source, include_usage=_wants_usage(payload))
                return _completion(model, await answer(http, model, arguments))
            result = await litellm.acompletion(**arguments)
    except TimeoutError:
        raise silence(model=model.name, timeout_s=model.timeout_s, streamed_anything=False) from None
    except Exception as exc:
        raise classify(exc, model=model.name, secrets=model.secrets(), streamed_anything=False) from None
    if arguments["stream"]:
        return HostedStream(model, result, include_usage=_wants_usage(payload))
    return _completion(model, result.model_dump())


def _completion(model: HostedModel, raw: dict[str, Any]) -> HostedCompletion:
    """The client's ``chat.completion`` (OpenAI's fields only), with its usage and cost."""
    usage = usage_from(raw.get("usage"))
    body = orjson.dumps(completion_json(raw, usage))
    return HostedCompletion(body=body, usage=usage, cost_usd=cost_of(usage, model.price))


def provider_of(model: str) -> str | None:
    """The litellm provider that serves ``model`` (``openai/gpt-4o``, ``anthropic/...``, a bare known name),
    or ``None`` when litellm knows none: refused in the config rather than on every request."""
    try:
        return str(litellm.get_llm_provider(model)[1])
    except Exception:  # litellm raises its BadRequestError, and others, for a model it cannot place
        return None
