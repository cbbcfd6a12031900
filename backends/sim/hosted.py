"""A hosted frontier-model API stand-in: OpenAI's wire format, fixed latency profile, no queueing.

Unlike a replica it has no KV cache or batching: every request waits its own TTFT, then streams
one token per TPOT, each jittered deterministically from the request and the seed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import xxhash
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.responses import StreamingResponse

from backends.sim.chat_template import ChatTemplate
from backends.sim.clock import VirtualClock
from backends.sim.errors import validation_message
from backends.sim.generation import OutputPlan, TokenStream, plan_output, request_seed
from backends.sim.protocol import ChatCompletionRequest, CompletionRequest
from backends.sim.tokenizer import Tokenizer, check_token_ids
from backends.sim.wire import DONE, OrjsonResponse, sse_event

SYSTEM_FINGERPRINT = "fp_spillgate_sim"


@dataclass(frozen=True)
class HostedConfig:
    """Options of ``spillgate sim-hosted``."""

    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "frontier-large"
    ttft_ms: float = 350.0
    tpot_ms: float = 12.0
    jitter: float = 0.1
    time_scale: float = 1.0
    seed: int = 0


def _openai_error(message: str, err_type: str, code: str | None, status: int) -> OrjsonResponse:
    return OrjsonResponse(
        {"error": {"message": message, "type": err_type, "param": None, "code": code}}, status_code=status
    )


class _Unauthorized(Exception):
    pass


async def _require_api_key(request: Request) -> None:
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise _Unauthorized


class _HostedModel:
    """Latency profile and deterministic output of the hosted model."""

    def __init__(self, config: HostedConfig) -> None:
        self.config = config
        self.clock = VirtualClock(config.time_scale)
        self.tokenizer = Tokenizer()
        self.template = ChatTemplate(self.tokenizer)
        self._stopping = False

    def stop(self) -> None:
        """Cut every stream short at its next token (server shutdown)."""
        self._stopping = True

    def jittered(self, base_ms: float, seed: int, index: int) -> float:
        """``base_ms`` in seconds, times a factor in [1 - jitter, 1 + jitter] fixed by seed and index."""
        unit = xxhash.xxh64_intdigest(index.to_bytes(8, "little"), seed=seed) / 2**64
        return base_ms / 1000 * (1 + self.config.jitter * (2 * unit - 1))

    def plan(self, prompt_ids: list[int], limit: int | None, request_seed_value: int | None) -> tuple[int, OutputPlan]:
        seed = request_seed(prompt_ids, self.config.seed, request_seed_value)
        return seed, plan_output(seed, limit, exact=limit is not None)

    async def tokens(self, seed: int, plan: OutputPlan) -> AsyncIterator[int]:
        """Output ids, each released at its simulated time (TTFT, then one TPOT per token)."""
        stream = TokenStream(self.tokenizer, seed, plan)
        deadline = self.clock.now() + self.jittered(self.config.ttft_ms, seed, 0)
        for index in range(plan.length):
            if self._stopping:
                return
            if index:
                deadline += self.jittered(self.config.tpot_ms, seed, index)
            await self.clock.sleep_until(deadline)
            yield stream.next_id()


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _finish(plan: OutputPlan) -> str:
    return "stop" if plan.stops else "length"


def create_hosted_app(config: HostedConfig) -> FastAPI:
    """An OpenAI-compatible app with the hosted model's latency profile."""
    model = _HostedModel(config)
    app = FastAPI(title="spillgate hosted-model simulator", docs_url=None, redoc_url=None)
    app.state.stop_generation = model.stop

    @app.exception_handler(_Unauthorized)
    async def unauthorized(request: Request, exc: Exception) -> OrjsonResponse:
        return _openai_error(
            "You didn't provide an API key. You need to provide your API key in an Authorization header "
            "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            "invalid_request_error",
            "invalid_api_key",
            401,
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: Exception) -> OrjsonResponse:
        assert isinstance(exc, RequestValidationError)
        return _openai_error(validation_message(exc), "invalid_request_error", None, 400)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models", dependencies=[Depends(_require_api_key)])
    async def models() -> dict[str, Any]:
        card = {"id": config.model_name, "object": "model", "created": 1700000000, "owned_by": "spillgate-sim"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions", dependencies=[Depends(_require_api_key)])
    async def chat(body: ChatCompletionRequest) -> Response:
        messages = [message.model_dump(exclude_none=True) for message in body.messages]
        prompt_ids = model.template.render(messages, body.tools)
        seed, plan = model.plan(prompt_ids, body.token_limit, body.seed)
        rid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        head = {"id": rid, "created": created, "model": config.model_name, "system_fingerprint": SYSTEM_FINGERPRINT}

        if not body.stream:
            ids = [token async for token in model.tokens(seed, plan)]
            message = {"role": "assistant", "content": model.tokenizer.decode(ids), "refusal": None, "annotations": []}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": _finish(plan)}
            return OrjsonResponse(
                {
                    **head,
                    "object": "chat.completion",
                    "choices": [choice],
                    "usage": _usage(len(prompt_ids), len(ids)),
                    "service_tier": "default",
                }
            )

        def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
            payload: dict[str, Any] = {
                **head,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }
            if body.include_usage:
                payload["usage"] = None
            return sse_event(payload)

        async def events() -> AsyncIterator[bytes]:
            yield chunk({"role": "assistant", "content": "", "refusal": None}, None)
            count = 0
            async for token in model.tokens(seed, plan):
                count += 1
                text = model.tokenizer.decode([token])
                if text:
                    yield chunk({"content": text}, None)
            yield chunk({}, _finish(plan))
            if body.include_usage:
                usage = _usage(len(prompt_ids), count)
                yield sse_event({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage})
            yield DONE

        return _stream(events())

    @app.post("/v1/completions", dependencies=[Depends(_require_api_key)])
    async def completions(body: CompletionRequest) -> Response:
        try:
            prompt = body.single_prompt()
            prompt_ids = model.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
            check_token_ids(prompt_ids)
        except ValueError as exc:
            return _openai_error(str(exc), "invalid_request_error", None, 400)
        seed, plan = model.plan(prompt_ids, body.max_tokens, body.seed)
        rid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        head = {"id": rid, "object": "text_completion", "created": created, "model": config.model_name}

        if not body.stream:
            ids = [token async for token in model.tokens(seed, plan)]
            choice = {"index": 0, "text": model.tokenizer.decode(ids), "logprobs": None, "finish_reason": _finish(plan)}
            return OrjsonResponse({**head, "choices": [choice], "usage": _usage(len(prompt_ids), len(ids))})

        async def events() -> AsyncIterator[bytes]:
            count = 0
            async for token in model.tokens(seed, plan):
                count += 1
                finish = _finish(plan) if count == plan.length else None
                text = model.tokenizer.decode([token])
                yield sse_event(
                    {**head, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
                )
            if body.include_usage:
                yield sse_event({**head, "choices": [], "usage": _usage(len(prompt_ids), count)})
            yield DONE

        return _stream(events())

    return app


def _stream(events: AsyncIterator[bytes]) -> Response:
    return StreamingResponse(events, media_type="text/event-stream")
