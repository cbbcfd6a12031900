"""A streamed ``/v1/responses`` answer: the typed server-sent events both engines send for a text reply.

Each event is written ``event: <type>`` then ``data: <json>``, numbered by ``sequence_number`` from 0, with no
``[DONE]`` after the last: ``response.created`` and ``response.in_progress`` (the response with no output yet),
then, once the first text is out, ``response.output_item.added`` and ``response.content_part.added``, one
``response.output_text.delta`` per piece of text, ``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done``, and the whole response last. SGLang names the last event after the response's status
(``response.incomplete`` for a reply cut by ``max_output_tokens``), vLLM always ``response.completed``
(``serving_responses.py: _responses_stream_generator_non_harmony``; ``responses/serving.py:
responses_stream_generator``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from spillgate.backends.sim.choices import Choice, merged
from spillgate.backends.sim.responses_payloads import Engine, message_item, output_text


def sse(event: dict[str, Any]) -> bytes:
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class _Numbered:
    """Stamps each event with the next ``sequence_number``."""

    def __init__(self) -> None:
        self._next = 0

    def __call__(self, event: dict[str, Any]) -> bytes:
        event["sequence_number"] = self._next
        self._next += 1
        return sse(event)


async def events(
    choice: Choice,
    *,
    engine: Engine,
    item_id: str,
    opening: dict[str, Any],
    finish: Callable[[str, list[dict[str, Any]]], dict[str, Any]],
) -> AsyncIterator[bytes]:
    """The stream of one reply. ``opening`` is the response before any output; ``finish(text, output)`` builds (and
    stores) the whole response from the text sent and the output items streamed."""
    emit = _Numbered()
    yield emit({"type": "response.created", "response": opening})
    yield emit({"type": "response.in_progress", "response": opening})
    where = {"item_id": item_id, "output_index": 0}
    text, opened = "", False
    async for _, update in merged([choice]):
        delta, _tokens = choice.advance(update)
        if not delta:
            continue
        if not opened:
            opened = True
            item = message_item(item_id, None, engine=engine, done=False)
            yield emit({"type": "response.output_item.added", "output_index": 0, "item": item})
            part = output_text("", engine=engine, opening=True)
            yield emit({"type": "response.content_part.added", **where, "content_index": 0, "part": part})
        text += delta
        delta_event = {"type": "response.output_text.delta", **where, "content_index": 0, "delta": delta}
        yield emit({**delta_event, "logprobs": []})
    output: list[dict[str, Any]] = []
    if opened:
        done = {"type": "response.output_text.done", **where, "content_index": 0, "text": text, "logprobs": []}
        yield emit(done)
        part = output_text(text, engine=engine)
        yield emit({"type": "response.content_part.done", **where, "content_index": 0, "part": part})
        output = [message_item(item_id, text, engine=engine, done=True)]
        yield emit({"type": "response.output_item.done", "output_index": 0, "item": output[0]})
    final = finish(text, output)
    kind = f"response.{final['status']}" if engine == "sglang" else "response.completed"
    yield emit({"type": kind, "response": final})
