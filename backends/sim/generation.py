"""What the simulated model "says": a deterministic stream of word tokens and where it stops.

Output depends only on the prompt ids and the seeds, so a repeated request gets the same reply,
and a client that appends the reply to its conversation re-encodes it to the same ids.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

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


def request_seed(prompt_ids: Sequence[int], server_seed: int, request_seed: int | None, choice: int = 0) -> int:
    """A seed from the prompt (and the client's seed, if any), so equal requests get equal replies; each of ``n``
    choices (``choice`` > 0) gets its own."""
    digest = xxhash.xxh3_64(array("q", prompt_ids).tobytes(), seed=server_seed)
    if request_seed is not None:
        digest.update((request_seed & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "little"))
    if choice:
        digest.update(b"choice" + choice.to_bytes(4, "little"))
    return digest.intdigest()


def plan_scripted(script_tokens: int, max_new_tokens: int | None) -> OutputPlan:
    """A reply fixed in advance (constrained JSON) ends with end-of-turn after its tokens, unless the limit cuts it."""
    if max_new_tokens is not None and script_tokens + 1 > max_new_tokens:
        return OutputPlan(length=max_new_tokens, stops=False)
    return OutputPlan(length=script_tokens + 1, stops=True)


def plan_output(seed: int, max_new_tokens: int | None, *, exact: bool) -> OutputPlan:
    """``exact`` (the client set a limit, or asked to ignore EOS) generates exactly the limit."""
    if exact and max_new_tokens is not None:
        return OutputPlan(length=max_new_tokens, stops=False)
    natural = random.Random(seed).randint(MIN_NATURAL_TOKENS, MAX_NATURAL_TOKENS)
    if max_new_tokens is not None and natural >= max_new_tokens:
        return OutputPlan(length=max_new_tokens, stops=False)
    return OutputPlan(length=natural, stops=True)


@dataclass
class StopWatch:
    """The client's stop strings: where the text first contains one, and how much text is safe to show."""

    strings: tuple[str, ...]
    matched: str | None = None
    cut: int | None = None
    """Characters of text before the matched stop string."""
    _text: list[str] = field(default_factory=list)
    _length: int = 0

    def feed(self, piece: str) -> None:
        if self.matched is not None or not piece:
            return
        start = max(0, self._length - max(map(len, self.strings)) + 1)
        self._text.append(piece)
        self._length += len(piece)
        text = "".join(self._text)
        self._text = [text]
        found = [(text.find(s, start), s) for s in self.strings if text.find(s, start) >= 0]
        if found:
            self.cut, self.matched = min(found)

    def held_back(self, text: str) -> int:
        """Characters at the end of ``text`` that may be the start of a stop string (not shown yet)."""
        for size in range(min(len(text), max(map(len, self.strings)) - 1), 0, -1):
            if any(s.startswith(text[-size:]) for s in self.strings):
                return size
        return 0


class TokenStream:
    """Yields a request's output ids one at a time: capitalised sentences of output words, or a ``script`` of
    (id, text) pieces fixed in advance; records each token's text and watches for ``stop`` strings."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        seed: int,
        plan: OutputPlan,
        script: Sequence[tuple[int, str]] | None = None,
        stop: Sequence[str] = (),
    ) -> None:
        self._tokenizer = tokenizer
        self._rng = random.Random(seed)
        self.seed = seed
        self._plan = plan
        self._script = script
        self._produced = 0
        self._sentence_start = True
        self._after_word = False
        self.texts: list[str] = []
        """Each produced token's text (empty for end-of-turn)."""
        strings = tuple(s for s in stop if s)
        self.stop = StopWatch(strings) if strings else None

    @property
    def matched_stop(self) -> str | None:
        return self.stop.matched if self.stop is not None else None

    def text(self, *, finished: bool, tokens: int | None = None) -> str:
        """The reply as a client may see it after its first ``tokens`` tokens (default all so far): cut before a
        matched stop string, and while running without a tail that may yet become one."""
        text = "".join(self.texts[:tokens])
        if self.stop is None:
            return text
        if self.stop.cut is not None and self.stop.cut <= len(text):
            return text[: self.stop.cut]
        return text if finished else text[: len(text) - self.stop.held_back(text)]

    def next_id(self) -> int:
        token = self._next_id()
        piece = "" if token == END_OF_TURN else self._tokenizer.decode([token])
        if self._script is not None and self._produced <= len(self._script):
            piece = self._script[self._produced - 1][1]
        self.texts.append(piece)
        if self.stop is not None:
            self.stop.feed(piece)
        return token

    def _next_id(self) -> int:
        self._produced += 1
        if self._plan.stops and self._produced == self._plan.length:
            return END_OF_TURN
        if self._script is not None:
            return self._script[self._produced - 1][0] if self._produced <= len(self._script) else END_OF_TURN
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
