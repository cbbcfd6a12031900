"""A Llama-3.1-style chat template that renders messages straight to token ids.

Each message is encoded on its own between special tokens, so the ids of a conversation's turn n
(including the assistant header that prompts generation) are a prefix of the ids of turn n + 1.
That is the property real chat templates have and the one prefix caching depends on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from spillgate.backends.sim.tokenizer import BEGIN_OF_TEXT, END_HEADER, END_OF_TURN, START_HEADER, Tokenizer

_DATE_PREAMBLE = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
_TOOLS_PREAMBLE = (
    "Environment: ipython\n\nYou have access to the following functions. To call a function, respond "
    "with JSON for a function call in the format "
    '{"name": function name, "parameters": dictionary of argument name and its value}.\n\n'
)


def content_text(content: Any) -> str:
    """Message content as text: a string, or the text of a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, Mapping):
            if part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif part.get("type") in ("image_url", "input_audio", "video_url", "audio_url"):
                parts.append(f"<{part['type']}>")
        else:
            parts.append(str(part))
    return "".join(parts)


def _tool_calls_text(tool_calls: Sequence[Mapping[str, Any]]) -> str:
    calls = []
    for call in tool_calls:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(orjson.JSONDecodeError):
                arguments = orjson.loads(arguments)
        calls.append(orjson.dumps({"name": function.get("name"), "parameters": arguments}).decode())
    return "; ".join(calls)


class ChatTemplate:
    """Renders OpenAI-style messages (and tool definitions) into prompt token ids."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer

    def _turn(self, role: str, text: str) -> list[int]:
        return [
            START_HEADER,
            *self._tokenizer.encode(role),
            END_HEADER,
            *self._tokenizer.encode("\n\n"),
            *self._tokenizer.encode(text.strip()),
            END_OF_TURN,
        ]

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        system_text = ""
        rest = list(messages)
        if rest and rest[0].get("role") in ("system", "developer"):
            system_text = content_text(rest.pop(0).get("content"))
        preamble = _DATE_PREAMBLE
        if tools:
            definitions = "\n\n".join(orjson.dumps(tool, option=orjson.OPT_INDENT_2).decode() for tool in tools)
            preamble = _TOOLS_PREAMBLE + definitions + "\n\n" + preamble
        ids = [BEGIN_OF_TEXT, *self._turn("system", preamble + system_text)]
        for message in rest:
            role = str(message.get("role", "user"))
            text = content_text(message.get("content"))
            if role == "assistant" and message.get("tool_calls"):
                text += _tool_calls_text(message["tool_calls"])
            if role in ("tool", "function"):
                role = "ipython"
            ids.extend(self._turn(role, text))
        if add_generation_prompt:
            ids.extend([START_HEADER, *self._tokenizer.encode("assistant"), END_HEADER])
            ids.extend(self._tokenizer.encode("\n\n"))
        return ids
