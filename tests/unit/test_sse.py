"""The relay forwards whole events however upstream reads split them, and finds the usage chunk."""

from __future__ import annotations

from gateway.sse import EventRelay

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
    assert relay.feed(b":1}\n\ndata: x") == b'data: {"a":1}\n\n'
    assert relay.flush() == b"data: x"


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
