"""A chat-completions stream as Anthropic's event stream.

``message_start`` goes out with the first chunk, then one content block at a time: text as ``text_delta``
events, each tool call as a ``tool_use`` block fed by ``input_json_delta`` events. The usage chunk the face
asked for (``stream_options.include_usage``) arrives last; ``message_delta`` carries it with the stop reason.
A stream the gateway ended with an error ends with Anthropic's ``error`` event instead.
"""

from __future__ import annotations

from typing import Any

import orjson

from spillgate.gateway.faces.bridge import sse
from spillgate.gateway.faces.messages_answer import matched_stop, message_id, stop_reason, tool_use_id, usage
from spillgate.gateway.faces.messages_errors import error_object


class MessagesStream:
    """Translates one streamed answer, chunk by chunk (a :class:`~gateway.faces.bridge.StreamTranslator`)."""

    def __init__(self, model: str, stop_sequences: tuple[str, ...]) -> None:
        self._model = model
        self._stop_sequences = stop_sequences
        self._started = False
        self._pinged = False
        self._index = -1
        """The open content block's index; -1 when none is open."""
        self._open: str | None = None
        """``text``, or ``tool:N`` for the chat stream's tool call N."""
        self._blocks = 0
        self._tools_called = False
        self._finish: object = None
        self._matched: object = None
        self._usage: object = None
        self._sent: dict[str, str] = {}
        """Per tool block: the arguments streamed so far."""
        self._held: dict[str, str] = {}
        """Per tool block: arguments held back because they do not start a JSON object (Anthropic's ``input`` always
        is one): sent whole as ``{"_raw": ...}`` when the block closes, as the whole answer gives them."""

    async def chunk(self, chunk: dict[str, Any]) -> bytes:
        out: list[bytes] = []
        if not self._started:
            out.append(self._message_start())
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
        if choice is None:
            return b"".join(out)
        delta = choice.get("delta")
        if isinstance(delta, dict):
            text = delta.get("content")
            if isinstance(text, str) and text:
                out += self._open_block("text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": text}))
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    out += self._tool_call(call)
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
            self._matched = matched_stop(choice)
        return b"".join(out)

    async def end(self, error: dict[str, Any] | None) -> bytes:
        out: list[bytes] = []
        if error is not None:
            # Anthropic's own streams end with the error event alone: the client raises on it.
            message = error.get("message") if isinstance(error.get("message"), str) else "The stream failed."
            payload = {"type": "error", "error": error_object(_status_of(error), str(message))}
            return sse("error", payload)
        if not self._started:
            out.append(self._message_start())
        out += self._close_block()
        reason, sequence = stop_reason(self._finish, self._matched, self._stop_sequences)
        if reason == "end_turn" and self._tools_called:
            reason = "tool_use"
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        out.append(sse("message_delta", {"type": "message_delta", "delta": delta, "usage": usage(self._usage)}))
        out.append(sse("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    def _message_start(self) -> bytes:
        self._started = True
        message = {
            "id": message_id(),
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},  # known at the end: message_delta has them
        }
        return sse("message_start", {"type": "message_start", "message": message})

    def _tool_call(self, call: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        number = call.get("index", 0)
        key = f"tool:{number}"
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        if self._open != key:
            block = {
                "type": "tool_use",
                "id": tool_use_id(call.get("id")),
                "name": function.get("name") or "",
                "input": {},
            }
            out += self._open_block(key, block)
            self._tools_called = True
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            sent = self._sent.get(key, "")
            if key not in self._held and (sent + arguments).lstrip()[:1] not in ("", "{"):
                self._held[key] = sent.strip()  # only whitespace went out so far
            if key in self._held:
                self._held[key] += arguments
            else:
                self._sent[key] = sent + arguments
                out.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return out

    def _open_block(self, key: str, block: dict[str, Any]) -> list[bytes]:
        if self._open == key:
            return []
        out = self._close_block()
        self._index = self._blocks
        self._blocks += 1
        self._open = key
        out.append(
            sse("content_block_start", {"type": "content_block_start", "index": self._index, "content_block": block})
        )
        if not self._pinged:
            self._pinged = True
            out.append(sse("ping", {"type": "ping"}))
        return out

    def _close_block(self) -> list[bytes]:
        if self._open is None:
            return []
        out: list[bytes] = []
        held = self._held.pop(self._open, None)
        if held is not None:
            raw = orjson.dumps({"_raw": held}).decode()
            out.append(self._delta({"type": "input_json_delta", "partial_json": raw}))
        self._open = None
        out.append(sse("content_block_stop", {"type": "content_block_stop", "index": self._index}))
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta})


def _status_of(error: dict[str, Any]) -> int:
    """The status an in-band OpenAI error stands for, by its type (the stream's status is long gone)."""
    kinds = {"rate_limit_error": 429, "service_unavailable": 503, "timeout_error": 504, "invalid_request_error": 400}
    return kinds.get(error.get("type"), 500) if isinstance(error.get("type"), str) else 500
