"""The relay forwards whole events however upstream reads split them, and finds the usage chunk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spillgate.gateway.serving.sse import EventRelay, InvalidEvent, carries_text

EVENTS = [
    b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n',
    b'data: {"choices":[{"delta":{"content":"b"}}]}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n',
    b"data: [DONE]\n\n",
]
STREAM = b"".join(EVENTS)


def relay_in_pieces(size: int, *, strip_usage: bool) -> tuple[bytes, EventRelay]:
    relay = EventRelay(strip_usage=strip_usage)
    out = b"".join(relay.feed(STREAM[i : i + size]) for i in range(0, len(STREAM), size))
    return out + relay.flush(), relay


def test_any_split_yields_whole_events_in_order() -> None:
    for size in (1, 2, 7, 50, len(STREAM)):
        out, relay = relay_in_pieces(size, strip_usage=False)
        assert out == STREAM
        assert relay.usage == {"prompt_tokens": 3, "completion_tokens": 2}
        assert relay.events == 4


def test_usage_chunk_is_stripped_when_not_asked_for() -> None:
    out, relay = relay_in_pieces(5, strip_usage=True)
    assert out == EVENTS[0] + EVENTS[1] + EVENTS[3]
    assert relay.usage == {"prompt_tokens": 3, "completion_tokens": 2}


def test_partial_event_is_held_back() -> None:
    relay = EventRelay(strip_usage=False)
    assert relay.feed(b'data: {"a"') == b""
    assert relay.feed(b":1}\n\ndata: [DO") == b'data: {"a":1}\n\n'
    assert relay.feed(b"NE]") == b""
    assert relay.flush() == b"data: [DONE]"


@pytest.mark.parametrize(
    "stream",
    [
        b"data: {not json\n\n",
        b'data: ["an array"]\n\n',
        b"<html>oops</html>\n\n",
        b'data: {"choices":[]}\n\ngarbage line\n\n',
    ],
)
def test_an_event_that_is_not_openai_is_refused(stream: bytes) -> None:
    with pytest.raises(InvalidEvent):
        EventRelay(strip_usage=False).feed(stream)


def test_a_final_event_without_its_blank_line_is_checked_too() -> None:
    relay = EventRelay(strip_usage=False)
    assert relay.feed(b'data: {"a":1}\n\ndata: x') == b'data: {"a":1}\n\n'
    with pytest.raises(InvalidEvent):
        relay.flush()


def test_comments_and_other_fields_pass() -> None:
    stream = b': keep-alive\n\nevent: message\nid: 7\ndata: {"a":1}\n\ndata: [DONE]\n\n'
    assert EventRelay(strip_usage=False).feed(stream) == stream


def test_crlf_framed_events_are_relayed_one_by_one_with_lf() -> None:
    crlf = STREAM.replace(b"\n", b"\r\n")
    for size in (1, 2, 7, 50, len(crlf)):
        relay = EventRelay(strip_usage=True)
        pieces = [relay.feed(crlf[i : i + size]) for i in range(0, len(crlf), size)]
        assert b"".join(pieces) + relay.flush() == EVENTS[0] + EVENTS[1] + EVENTS[3]
        assert relay.usage == {"prompt_tokens": 3, "completion_tokens": 2}
        assert relay.events == 4
    relay = EventRelay(strip_usage=False)
    assert relay.feed(EVENTS[0].replace(b"\n", b"\r\n") + b"data: x") == EVENTS[0], "no waiting for the end"


def test_usage_is_found_without_a_space_after_data() -> None:
    relay = EventRelay(strip_usage=True)
    assert relay.feed(b'data:{"choices":[],"usage":{"prompt_tokens":1}}\n\ndata: [DONE]\n\n') == b"data: [DONE]\n\n"
    assert relay.usage == {"prompt_tokens": 1}


def _has_text(chunk: dict) -> bool:
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if choice.get("text") or delta.get("content") or delta.get("reasoning_content"):
            return True
    return False


def test_text_is_told_from_roles_finish_reasons_and_usage_in_captured_streams() -> None:
    """Which of a real server's chunks carry generated text (the relay's sign of another pass), compact or not."""
    fixtures = Path(__file__).parents[1] / "fixtures"
    seen = {True: 0, False: 0}
    for engine in ("sglang", "vllm"):
        for name in ("chat_stream", "completion_stream"):
            events = json.loads((fixtures / engine / "defaults" / f"{name}.json").read_text())["events"]
            for chunk in (event for event in events if isinstance(event, dict)):
                expected = _has_text(chunk)
                seen[expected] += 1
                for encoded in (json.dumps(chunk), json.dumps(chunk, separators=(",", ":"))):
                    assert carries_text(b"data: " + encoded.encode() + b"\n\n") == expected, (engine, encoded)
    assert seen[True] and seen[False]
