"""A streamed chat answer as OpenAI's Responses event stream.

``response.created`` and ``response.in_progress`` open it; the text becomes a message item (``output_item.added``,
``content_part.added``, ``output_text.delta``... and their ``done`` events), each function call a
``function_call`` item (``function_call_arguments.delta``/``done``); ``response.completed`` (``response.incomplete``
when the output limit cut it) closes it with the whole response and its usage. A stream the chat path ends with an
in-band error ends with ``response.failed``. Every event carries its ``sequence_number``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from spillgate.gateway.faces.bridge import sse
from spillgate.gateway.faces.responses_output import (
    Answer,
    Turn,
    function_call_item,
    message_item,
    new_id,
    reasoning_item,
    reasoning_of,
    response_object,
    status_of,
    text_part,
)

Finish = Callable[[dict[str, Any], Answer], Awaitable[None]]
"""Told the finished response and its answer (to store it), before the closing event is sent."""


class ResponsesStream:
    """Translates one streamed answer, chunk by chunk (:class:`~gateway.faces.bridge.StreamTranslator`)."""

    def __init__(self, turn: Turn, finish: Finish) -> None:
        self._turn = turn
        self._finish = finish
        self._answer = Answer()
        self._sequence = 0
        self._started = False
        self._output: list[dict[str, Any]] = []
        """Every item added so far, in output order (the open one last)."""
        self._text_open = False
        self._item_text = ""
        """The open message item's text (all the answer's text is in :attr:`_answer`)."""
        self._reasoning_open = False
        self._calls: dict[int, dict[str, Any]] = {}
        """The function calls by their chat ``index``; the open one is the last added."""
        self._call_open: int | None = None

    async def chunk(self, chunk: dict[str, Any]) -> bytes:
        out = self._start()
        if isinstance(chunk.get("model"), str) and self._answer.model is None:
            self._answer.model = chunk["model"]
        if isinstance(chunk.get("usage"), dict):
            self._answer.usage = chunk["usage"]
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
        if choice is None:
            return out
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        thought = reasoning_of(delta)
        if thought:
            out += self._reasoning(thought)
        text = delta.get("content")
        if isinstance(text, str) and text:
            out += self._text(text)
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                out += self._call(call)
        if isinstance(choice.get("finish_reason"), str):
            self._answer.finish_reason = choice["finish_reason"]
        return out

    async def end(self, error: dict[str, Any] | None) -> bytes:
        out = self._start()
        if error is not None:
            message = error.get("message") if isinstance(error.get("message"), str) else "The stream failed."
            failed = {"code": _failed_code(error), "message": message}
            response = response_object(self._turn, status="failed", output=self._output, error=failed)
            return out + self._event("response.failed", {"response": response})
        status = status_of(self._answer)
        out += self._close_reasoning(status) + self._close_text(status) + self._close_call(status)
        if not self._output:  # nothing was generated: still a message, empty
            self._output.append(message_item(self._answer.message_id, "", status))
        response = response_object(self._turn, status=status, output=self._output, answer=self._answer)
        await self._finish(response, self._answer)
        closing = "response.completed" if status == "completed" else "response.incomplete"
        return out + self._event(closing, {"response": response})

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        response = response_object(self._turn, status="in_progress", output=[])
        return self._event("response.created", {"response": response}) + self._event(
            "response.in_progress", {"response": response}
        )

    def _reasoning(self, text: str) -> bytes:
        """The reasoning item: it comes first (reasoning that comes after the answer began is dropped)."""
        out = b""
        item_id = self._answer.reasoning_id
        if self._answer.reasoning is None:
            out += self._close_text("completed") + self._close_call("completed")
            self._reasoning_open = True
            self._answer.reasoning = ""
            self._output.append(reasoning_item(item_id, None, "in_progress"))
            index = len(self._output) - 1
            out += self._event("response.output_item.added", {"output_index": index, "item": self._output[-1]})
            part = {"type": "reasoning_text", "text": ""}
            out += self._event(
                "response.content_part.added",
                {"item_id": item_id, "output_index": index, "content_index": 0, "part": part},
            )
        if not self._reasoning_open:
            return out  # its item is done: what comes after the answer began is not shown
        self._answer.reasoning += text
        delta = {"item_id": item_id, "output_index": self._index(item_id), "content_index": 0, "delta": text}
        return out + self._event("response.reasoning_text.delta", delta)

    def _close_reasoning(self, status: str) -> bytes:
        if not self._reasoning_open:
            return b""
        self._reasoning_open = False
        item_id, text = self._answer.reasoning_id, self._answer.reasoning or ""
        index = self._index(item_id)
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        out = self._event("response.reasoning_text.done", {**where, "text": text})
        out += self._event("response.content_part.done", {**where, "part": {"type": "reasoning_text", "text": text}})
        self._output[index] = reasoning_item(item_id, text, status)
        return out + self._event("response.output_item.done", {"output_index": index, "item": self._output[index]})

    def _index(self, item_id: str) -> int:
        return next(i for i, item in enumerate(self._output) if item["id"] == item_id)

    def _text(self, text: str) -> bytes:
        out = self._close_reasoning("completed") + self._close_call("completed")
        if not self._text_open:
            if self._answer.text is not None:  # text after a function call: a message item of its own
                self._answer.message_id = new_id("msg")
            self._text_open = True
            self._item_text = ""
            self._output.append(message_item(self._answer.message_id, None, "in_progress"))
            index = len(self._output) - 1
            out += self._event("response.output_item.added", {"output_index": index, "item": self._output[-1]})
            item_id = self._answer.message_id
            part = {"item_id": item_id, "output_index": index, "content_index": 0, "part": text_part("")}
            out += self._event("response.content_part.added", part)
        item_id = self._answer.message_id
        self._answer.text = (self._answer.text or "") + text
        self._item_text += text
        delta = {"item_id": item_id, "output_index": self._text_index(), "content_index": 0, "delta": text}
        return out + self._event("response.output_text.delta", {**delta, "logprobs": []})

    def _text_index(self) -> int:
        return next(i for i, item in enumerate(self._output) if item["id"] == self._answer.message_id)

    def _close_text(self, status: str) -> bytes:
        if not self._text_open:
            return b""
        self._text_open = False
        text, item_id, index = self._item_text, self._answer.message_id, self._text_index()
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        out = self._event("response.output_text.done", {**where, "text": text, "logprobs": []})
        out += self._event("response.content_part.done", {**where, "part": text_part(text)})
        self._output[index] = message_item(item_id, text, status)
        return out + self._event("response.output_item.done", {"output_index": index, "item": self._output[index]})

    def _call(self, delta: dict[str, Any]) -> bytes:
        position = delta.get("index") if isinstance(delta.get("index"), int) else len(self._calls)
        function = delta.get("function") if isinstance(delta.get("function"), dict) else {}
        out = b""
        call = self._calls.get(position)
        if call is None:
            out += self._close_reasoning("completed") + self._close_text("completed") + self._close_call("completed")
            call_id = delta.get("id") if isinstance(delta.get("id"), str) and delta.get("id") else new_id("call")
            call = {"id": new_id("fc"), "call_id": call_id, "name": str(function.get("name") or ""), "arguments": ""}
            self._calls[position] = call
            self._answer.calls.append(call)
            self._call_open = position
            self._output.append(function_call_item(call, "in_progress"))
            index = len(self._output) - 1
            out += self._event("response.output_item.added", {"output_index": index, "item": self._output[-1]})
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            call["arguments"] += arguments
            index = self._call_index(call)
            out += self._event(
                "response.function_call_arguments.delta",
                {"item_id": call["id"], "output_index": index, "delta": arguments},
            )
        return out

    def _call_index(self, call: dict[str, Any]) -> int:
        return next(i for i, item in enumerate(self._output) if item["id"] == call["id"])

    def _close_call(self, status: str) -> bytes:
        if self._call_open is None:
            return b""
        call = self._calls[self._call_open]
        self._call_open = None
        index = self._call_index(call)
        out = self._event(
            "response.function_call_arguments.done",
            {"item_id": call["id"], "output_index": index, "arguments": call["arguments"]},
        )
        self._output[index] = function_call_item(call, status)
        return out + self._event("response.output_item.done", {"output_index": index, "item": self._output[index]})

    def _event(self, kind: str, data: dict[str, Any]) -> bytes:
        event = sse(kind, {"type": kind, "sequence_number": self._sequence, **data})
        self._sequence += 1
        return event


def _failed_code(error: dict[str, Any]) -> str:
    """The ``code`` a failed response may carry (the SDK's ``ResponseError`` allows a fixed set)."""
    return "rate_limit_exceeded" if error.get("code") in ("rate_limit_exceeded", "rate_limited") else "server_error"
