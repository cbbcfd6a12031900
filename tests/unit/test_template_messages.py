"""How each engine hands a chat's messages to the chat template, which the prefix index must follow."""

from __future__ import annotations

from spillgate.backends.engines import engine_named

ASKED = {"role": "user", "content": "Go on:"}


def test_sglang_renders_a_final_assistant_text_as_the_users() -> None:
    payload = {"messages": [ASKED, {"role": "assistant", "content": "Once upon", "name": "x"}]}
    assert engine_named("sglang").template_messages(payload) == [ASKED, {"role": "user", "content": "Once upon"}]


def test_sglang_turns_a_final_tool_call_without_text_into_an_empty_user_turn() -> None:
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function"}]}
    assert engine_named("sglang").template_messages({"messages": [ASKED, call]}) == [
        ASKED,
        {"role": "user", "content": ""},
    ]


def test_sglang_keeps_the_message_when_asked_to_continue_it_or_when_it_has_parts() -> None:
    final = {"role": "assistant", "content": "Once upon"}
    continued = {"messages": [ASKED, final], "continue_final_message": True}
    assert engine_named("sglang").template_messages(continued) == [ASKED, final]
    parts = {"role": "assistant", "content": [{"type": "text", "text": "Once"}]}
    assert engine_named("sglang").template_messages({"messages": [ASKED, parts]}) == [ASKED, parts]


def test_a_chat_ending_with_the_user_is_left_alone() -> None:
    messages = [ASKED]
    assert engine_named("sglang").template_messages({"messages": messages}) is messages
    assert engine_named("sglang").template_messages({"messages": []}) == []


def test_vllm_renders_the_messages_as_sent() -> None:
    messages = [ASKED, {"role": "assistant", "content": "Once upon"}]
    assert engine_named("vllm").template_messages({"messages": messages}) is messages
