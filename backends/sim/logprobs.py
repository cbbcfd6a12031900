"""Log probabilities for the simulated model's tokens, in the chat and the legacy completions shapes.

There is no model, so the numbers are made up, but consistently: each token's score depends only on the request's
seed and the token's position, the chosen token is the most likely of its ``top_logprobs`` (as under greedy
decoding), and the alternatives are the simulator's own vocabulary with lower scores.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spillgate.backends.sim.tokenizer import OUTPUT_WORDS

MAX_TOP_LOGPROBS = 20
"""What both engines allow for ``top_logprobs`` (OpenAI's limit)."""


@dataclass(frozen=True)
class TokenScore:
    token: str
    logprob: float
    top: list[tuple[str, float]]
    """The ``k`` most likely tokens at this position, best first (the chosen one among them)."""


def score(seed: int, position: int, token: str, k: int) -> TokenScore:
    """The chosen ``token``'s log probability and the ``k`` best at ``position`` of a reply seeded with ``seed``."""
    rng = random.Random(seed * 1_000_003 + position)
    logprob = -round(rng.expovariate(4.0), 4)
    top = [(token, logprob)] if k > 0 else []
    spent = math.exp(logprob)
    for _ in range(max(0, k - 1)):
        share = (1.0 - spent) * rng.uniform(0.1, 0.6)
        spent += share
        word = " " + rng.choice(OUTPUT_WORDS)
        top.append((word if word != token else word.upper(), round(math.log(max(share, 1e-9)), 4)))
    top[1:] = sorted(top[1:], key=lambda item: -item[1])
    return TokenScore(token, logprob, top)


def scores(seed: int, start: int, tokens: Sequence[str], k: int) -> list[TokenScore]:
    """Scores of ``tokens``, the reply's tokens from position ``start`` on."""
    return [score(seed, start + i, token, k) for i, token in enumerate(tokens)]


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def chat_content(items: Sequence[TokenScore]) -> list[dict[str, Any]]:
    """``choices[].logprobs.content``: one entry per token with its ``top_logprobs``."""
    return [
        {**_entry(item.token, item.logprob), "top_logprobs": [_entry(t, lp) for t, lp in item.top]} for item in items
    ]


def legacy(items: Sequence[TokenScore], offset: int) -> dict[str, Any]:
    """Completions' ``logprobs`` object; ``offset`` is where the first token starts in the choice's text."""
    text_offset = []
    for item in items:
        text_offset.append(offset)
        offset += len(item.token)
    return {
        "text_offset": text_offset,
        "token_logprobs": [item.logprob for item in items],
        "tokens": [item.token for item in items],
        "top_logprobs": [dict(item.top) for item in items],
    }
