"""What the simulated model "says": a deterministic stream of word tokens and where it stops.

Output depends only on the prompt ids and the seeds, so a repeated request gets the same reply,
and a client that appends the reply to its conversation re-encodes it to the same ids.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from spillgate.backends.sim.tokenizer import END_OF_TURN, Tokenizer

MIN_NATURAL_TOKENS = 16
MAX_NATURAL_TOKENS = 400


@dataclass(frozen=True)
class OutputPlan:
    """How many tokens a request will produce, and whether the last one is the end-of-turn token."""

    length: int
    stops: bool

    def finish_reason(self, stop_token: int = END_OF_TURN) -> dict[str, object]:
        """The finish reason SGLang reports in meta_info for a request that ran to its plan."""
        if self.stops:
            return {"type": "stop", "matched": stop_token}
        return {"type": "length", "length": self.length}


def request_seed(prompt_ids: Sequence[int], server_seed: int, request_seed: int | None) -> int:
    """A seed from the prompt (and the client's seed, if any), so equal requests get equal replies."""
    digest = xxhash.xxh3_64(array("q", prompt_ids).tobytes(), seed=server_seed)
    if request_seed is not None:
        digest.update((request_seed & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "little"))
    return digest.intdigest()


def plan_output(seed: int, max_new_tokens: int | None, *, exact: bool) -> OutputPlan:
    """``exact`` (the client set a limit, or asked to ignore EOS) generates exactly the limit."""
    if exact and max_new_tokens is not None:
        return OutputPlan(length=max_new_tokens, stops=False)
    natural = random.Random(seed).randint(MIN_NATURAL_TOKENS, MAX_NATURAL_TOKENS)
    if max_new_tokens is not None and natural >= max_new_tokens:
        return OutputPlan(length=max_new_tokens, stops=False)
    return OutputPlan(length=natural, stops=True)


class TokenStream:
    """Yields a request's output ids one at a time: capitalised sentences of output words."""

    def __init__(self, tokenizer: Tokenizer, seed: int, plan: OutputPlan) -> None:
        self._tokenizer = tokenizer
        self._rng = random.Random(seed)
        self._plan = plan
        self._produced = 0
        self._sentence_start = True
        self._after_word = False

    def next_id(self) -> int:
        self._produced += 1
        if self._plan.stops and self._produced == self._plan.length:
            return END_OF_TURN
        if self._after_word and self._rng.random() < 0.12:
            self._after_word = False
            if self._rng.random() < 0.6:
                self._sentence_start = True
                return self._tokenizer.piece_id(".")
            return self._tokenizer.piece_id(",")
        word = self._rng.choice(self._tokenizer.output_words)
        if self._sentence_start:
            word = word.capitalize()
        piece = word if self._produced == 1 else " " + word
        self._sentence_start = False
        self._after_word = True
        return self._tokenizer.piece_id(piece)
