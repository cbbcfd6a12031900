"""The simulator's prompt token ids for the gateway (``prefix.tokenizer: simulated``), so that the gateway can match
prompts against the simulator's KV-cache events as it does against a real model's with its tokenizer files."""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from spillgate.backends.sim.chat_template import ChatTemplate
from spillgate.backends.sim.tokenizer import BEGIN_OF_TEXT, Tokenizer
from spillgate.cache.tokens import register_prompt_ids

_TURNS_KEPT = 4096


class _CachedTurns(ChatTemplate):
    """The simulator's template with each turn's ids kept: earlier turns are sent again with every request."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer)
        self._turns: OrderedDict[tuple[str, str], list[int]] = OrderedDict()

    def _turn(self, role: str, text: str) -> list[int]:
        key = (role, text)
        ids = self._turns.get(key)
        if ids is None:
            ids = self._turns[key] = super()._turn(role, text)
            if len(self._turns) > _TURNS_KEPT:
                self._turns.popitem(last=False)
        else:
            self._turns.move_to_end(key)
        return ids


class SimulatedPromptIds:
    """What the simulated engines cache for a chat or a completion."""

    exact = True

    def __init__(self) -> None:
        self._tokenizer = Tokenizer()
        self._template = _CachedTurns(self._tokenizer)

    @property
    def cached_tokens(self) -> int:
        return sum(len(ids) for ids in self._template._turns.values())

    def chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> array[int]:
        return array("I", self._template.render(messages, tools))  # type: ignore[arg-type]

    def completion(self, prompt: object) -> array[int]:
        if isinstance(prompt, list) and prompt and all(isinstance(item, int) for item in prompt):
            return array("I", prompt)
        if isinstance(prompt, list):
            prompt = "".join(str(item) for item in prompt)
        return array("I", [BEGIN_OF_TEXT, *self._tokenizer.encode(str(prompt))])


register_prompt_ids("simulated", SimulatedPromptIds)
