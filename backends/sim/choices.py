"""The ``n`` choices of one request: each a scheduled request of its own, their updates merged as they come.

Both engines run ``n > 1`` as ``n`` requests over the same prompt (SGLang expands the batch, vLLM forks the
sequence) and report one usage: the prompt once, the completions summed. A stream interleaves the choices' chunks
in the order their tokens are produced.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from spillgate.backends.sim import logprobs
from spillgate.backends.sim.client_features import ChoicePlan, streamed_arguments
from spillgate.backends.sim.engine import RequestHandle, Update
from spillgate.backends.sim.request import SimRequest
from spillgate.backends.sim.tokenizer import END_OF_TURN, SPECIAL_TOKENS


@dataclass
class Choice:
    """One choice and how much of it a stream has sent."""

    index: int
    handle: RequestHandle
    plan: ChoicePlan = field(default_factory=ChoicePlan)
    chars: int = 0
    tokens: int = 0
    call_id: str | None = None
    arguments_sent: int = 0

    @property
    def req(self) -> SimRequest:
        return self.handle.req

    def text(self, finished: bool = True, tokens: int | None = None) -> str:
        return self.req.tokens.text(finished=finished, tokens=tokens)

    def advance(self, update: Update) -> tuple[str, list[str]]:
        """The text and the tokens (as text, for logprobs) this update adds to what was sent. Read up to the
        update's last token: a stream that fell behind the scheduler must not send later tokens early."""
        end = self.tokens + len(update.new_ids)
        text = self.text(update.finished, end)
        delta, self.chars = text[self.chars :], max(self.chars, len(text))
        tokens = token_texts(self.req, self.tokens, end)
        self.tokens = end
        return delta, tokens

    def arguments_delta(self, finished: bool) -> str | None:
        """New argument text of the choice's tool call (up to the tokens :meth:`advance` took); None until the
        call's name has been written."""
        plan = self.plan
        text = self.text(finished, self.tokens)
        if plan.call is None or len(text) < plan.arguments_start:
            return None
        arguments = streamed_arguments(plan, text)
        delta, self.arguments_sent = arguments[self.arguments_sent :], len(arguments)
        return delta

    def called(self) -> bool:
        """Whether the reply holds the whole planned call (the grammar closed it before any limit)."""
        return (
            self.plan.call is not None
            and self.req.finish_reason is not None
            and self.req.finish_reason.get("type") == "stop"
        )

    def logprobs(self, tokens: list[str], start: int, k: int) -> list[logprobs.TokenScore]:
        return logprobs.scores(self.req.tokens.seed, start, tokens, k)


def token_texts(req: SimRequest, start: int, end: int) -> list[str]:
    """Output tokens ``start:end`` as text, special tokens by name (what logprobs show)."""
    texts = req.tokens.texts[start:end]
    ids = req.output_ids[start:end]
    return [
        SPECIAL_TOKENS[END_OF_TURN] if token == END_OF_TURN else text for token, text in zip(ids, texts, strict=True)
    ]


async def merged(choices: Sequence[Choice]) -> AsyncIterator[tuple[Choice, Update]]:
    """Every choice's updates, in the order they arrive, until all have finished."""
    if len(choices) == 1:
        async for update in choices[0].handle.updates():
            yield choices[0], update
        return
    queue: asyncio.Queue[tuple[Choice, Update | BaseException]] = asyncio.Queue()

    async def pump(choice: Choice) -> None:
        try:
            async for update in choice.handle.updates():
                await queue.put((choice, update))
        except Exception as exc:  # handed to the reader, which raises it
            await queue.put((choice, exc))

    tasks = [asyncio.ensure_future(pump(choice)) for choice in choices]
    try:
        left = len(choices)
        while left:
            choice, update = await queue.get()
            if isinstance(update, BaseException):
                raise update
            yield choice, update
            left -= update.finished
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def results(choices: Sequence[Choice], is_disconnected: Callable[[], Awaitable[bool]] | None) -> list[SimRequest]:
    return list(await asyncio.gather(*(choice.handle.result(is_disconnected) for choice in choices)))


def close_all(choices: Sequence[Choice]) -> Callable[[], None]:
    def close() -> None:
        for choice in choices:
            choice.handle.close()

    return close


def totals(reqs: Sequence[SimRequest]) -> dict[str, Any]:
    """Usage counts over the choices: the prompt and its cache hit once, every choice's completion."""
    first = reqs[0]
    return {
        "prompt_tokens": len(first.input_ids),
        "completion_tokens": sum(len(req.output_ids) for req in reqs),
        "cached_tokens": first.cached_tokens,
    }
