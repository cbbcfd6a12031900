"""What a hosted request returns: the OpenAI-format body or stream, its token usage and its cost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spillgate.backends.hosted.pricing import Price


@dataclass(frozen=True)
class Usage:
    """Token counts of one request; ``cached_tokens`` is the part of ``prompt_tokens`` read from a cache."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_tokens: int = 0
    """The part of ``prompt_tokens`` written to the prompt cache (Anthropic's ``cache_creation_input_tokens``)."""

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's ``usage`` object; cache writes, which OpenAI does not bill apart, as ``cache_creation_tokens``
        (the name litellm gives them) when there were any."""
        prompt_details: dict[str, int] = {"cached_tokens": self.cached_tokens}
        if self.cache_write_tokens:
            prompt_details["cache_creation_tokens"] = self.cache_write_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": prompt_details,
            "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
        }


@dataclass(frozen=True)
class HostedCompletion:
    """A whole (non-streaming) answer: OpenAI's ``chat.completion`` JSON, ready to send."""

    body: bytes
    usage: Usage | None
    cost_usd: float | None


def cost_of(usage: Usage | None, price: Price | None) -> float | None:
    """USD for a request's usage, or None when either is unknown."""
    if usage is None or price is None:
        return None
    return price.cost(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens, usage.cache_write_tokens)
