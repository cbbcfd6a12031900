"""The direct relay to OpenAI-compatible providers drops Anthropic's ``cache_control`` marks, as litellm does."""

from __future__ import annotations

from spillgate.backends.hosted.direct import _without_cache_control


def test_marks_are_dropped_from_messages_and_parts_and_nothing_else() -> None:
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": "hi", "cache_control": {"type": "ephemeral"}},
        {"role": "user", "content": [{"type": "text", "text": "more"}]},
    ]
    assert _without_cache_control(messages) == [
        {"role": "system", "content": [{"type": "text", "text": "rules"}]},
        {"role": "user", "content": "hi"},
        {"role": "user", "content": [{"type": "text", "text": "more"}]},
    ]
    assert messages[0]["content"][0]["cache_control"] == {"type": "ephemeral"}, "the caller's copy is untouched"


def test_messages_without_marks_are_passed_as_they_are() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "cache_control is only a word here"}]}]
    assert _without_cache_control(messages) is messages
