"""The request front end: validates prompt ids like SGLang's TokenizerManager, then submits them.

Routes hand it token ids and sampling limits; it returns a handle whose updates stream the
request's output, records the per-request metrics, and aborts the request if the caller goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from spillgate.backends.sim.config import ReplicaConfig
from spillgate.backends.sim.generation import TokenStream, plan_output, plan_scripted, request_seed
from spillgate.backends.sim.kv_events import NAMESPACE_SEPARATOR
from spillgate.backends.sim.metrics import ReplicaMetrics
from spillgate.backends.sim.request import SimRequest
from spillgate.backends.sim.scheduler import Scheduler
from spillgate.backends.sim.tokenizer import Tokenizer, check_token_ids

DISCONNECT_POLL_S = 0.5


def cache_namespace(extra_key: str | None, cache_salt: str | None) -> str | None:
    """SGLang keys the radix tree by (extra_key, cache_salt); unset or empty means shared
    (``kv_events.split_namespace`` takes it apart)."""
    if not extra_key and not cache_salt:
        return None
    return f"{extra_key or ''}{NAMESPACE_SEPARATOR}{cache_salt or ''}"


@dataclass(frozen=True)
class GenerationParams:
    """Sampling limits and routing fields; ``max_new_tokens`` is the client's limit, if it set one."""

    max_new_tokens: int | None = None
    exact_length: bool = False
    seed: int | None = None
    rid: str | None = None
    cache_salt: str | None = None
    extra_key: str | None = None
    priority: int | None = None
    stream: bool = False
    log_metrics: bool = True
    choice: int = 0
    """Which of ``n`` choices this is: each gets its own seed."""
    stop: tuple[str, ...] = ()
    script: str | None = None
    """The reply fixed in advance (JSON a grammar would force), instead of free words."""


@dataclass(frozen=True)
class Update:
    """Output produced since the previous update."""

    new_ids: list[int]
    finished: bool


class RequestHandle:
    """A submitted request: iterate :meth:`updates` (or await :meth:`result`); close to abort."""

    def __init__(self, engine: Engine, req: SimRequest, params: GenerationParams) -> None:
        self._engine = engine
        self.req = req
        self.params = params
        self.received_unix = time.time()
        self._closed = False

    async def updates(self) -> AsyncIterator[Update]:
        req, metrics = self.req, self._engine.metrics if self.params.log_metrics else None
        offset = 0
        last_token_at: float | None = None
        try:
            while True:
                await req.wait_for_change()
                new_ids = req.output_ids[offset:]
                offset += len(new_ids)
                if metrics is not None and new_ids and req.last_token_at is not None:
                    if last_token_at is None:
                        metrics.observe_first_token(req, is_streaming=self.params.stream)
                        metrics.observe_inter_token(req.last_token_at - req.first_token_at, len(new_ids) - 1)
                    else:
                        metrics.observe_inter_token(req.last_token_at - last_token_at, len(new_ids))
                    last_token_at = req.last_token_at
                if req.finished and metrics is not None:
                    metrics.observe_finished(req, is_streaming=self.params.stream)
                yield Update(new_ids=new_ids, finished=req.finished)
                if req.finished:
                    return
        finally:
            self.close()

    async def result(self, is_disconnected: Callable[[], Awaitable[bool]] | None = None) -> SimRequest:
        """Wait for the whole output; abort if ``is_disconnected`` says the client has gone."""

        async def consume() -> None:
            async for _ in self.updates():
                pass

        task = asyncio.ensure_future(consume())
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if not task.done() and is_disconnected is not None and await is_disconnected():
                    break
        finally:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return self.req

    def close(self) -> None:
        """Abort the request unless it already finished (a client that disconnects ends here)."""
        if self._closed:
            return
        self._closed = True
        if not self.req.finished:
            self._engine.scheduler.abort(self.req)
            if self.params.log_metrics:
                self._engine.metrics.observe_aborted()


class Engine:
    """Turns prompt ids and limits into scheduled requests."""

    def __init__(
        self, config: ReplicaConfig, scheduler: Scheduler, tokenizer: Tokenizer, metrics: ReplicaMetrics
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.metrics = metrics

    def _validate(self, input_ids: list[int], max_new_tokens: int | None) -> int:
        """SGLang's length checks; returns the request's max_new_tokens after clamping."""
        config = self.config
        num_input = len(input_ids)
        if num_input == 0:
            raise ValueError("The input is empty. Either text, input_ids or input_embeds should be provided.")
        check_token_ids(input_ids)
        if num_input >= config.context_length:
            raise ValueError(
                f"The input ({num_input} tokens) is longer than the model's context length "
                f"({config.context_length} tokens)."
            )
        if max_new_tokens is not None and max_new_tokens + num_input > config.context_length:
            raise ValueError(
                f"Requested token count exceeds the model's maximum context length of {config.context_length} "
                f"tokens. You requested a total of {max_new_tokens + num_input} tokens: {num_input} tokens "
                f"from the input messages and {max_new_tokens} tokens for the completion. Please reduce the "
                "number of tokens in the input messages or the completion to fit within the limit."
            )
        if num_input >= config.max_req_input_len:
            raise ValueError(
                f"Input length ({num_input} tokens) exceeds the maximum allowed length "
                f"({config.max_req_input_len} tokens). Use a shorter input or enable --allow-auto-truncate."
            )
        room = config.max_req_len - num_input
        return room if max_new_tokens is None else min(max_new_tokens, room)

    def submit(self, input_ids: list[int], params: GenerationParams) -> RequestHandle:
        """Validate and queue a request; raises ValueError (an HTTP 400) for bad input."""
        max_new_tokens = self._validate(input_ids, params.max_new_tokens)
        seed = request_seed(input_ids, self.config.seed, params.seed, params.choice)
        script = self.tokenizer.encode_pieces(params.script) if params.script is not None else None
        if script is not None:
            plan = plan_scripted(len(script), max_new_tokens)
        else:
            plan = plan_output(seed, max_new_tokens, exact=params.exact_length)
        req = SimRequest(
            rid=params.rid or uuid.uuid4().hex,
            input_ids=input_ids,
            max_new_tokens=max_new_tokens,
            plan=plan,
            tokens=TokenStream(self.tokenizer, seed, plan, script, params.stop),
            arrival=self.scheduler.clock.now(),
            namespace=cache_namespace(params.extra_key, params.cache_salt),
            priority=params.priority,
        )
        if plan.length == 0:
            req.finish_reason = plan.finish_reason()
            req.finished_at = req.arrival
            req.notify()
        else:
            self.scheduler.submit(req)
        return RequestHandle(self, req, params)
