"""Any body at all: the Messages face answers a 400 or translates it, and what it translates the chat path takes
(never a traceback, never a 500)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spillgate.gateway.control.config import LimitsConfig
from spillgate.gateway.errors import ApiError
from spillgate.gateway.faces.messages_answer import whole_message
from spillgate.gateway.faces.messages_request import translate_request
from spillgate.gateway.serving.validation import parse_chat_request

LIMITS = LimitsConfig()

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
block_types = st.sampled_from(["text", "image", "tool_use", "tool_result", "thinking", "document", "x"])
blocks = st.fixed_dictionaries(
    {"type": block_types},
    optional={
        "text": json_values,
        "source": json_values,
        "id": json_values,
        "name": json_values,
        "input": json_values,
        "tool_use_id": json_values,
        "content": json_values,
        "cache_control": st.sampled_from([{"type": "ephemeral"}, {"type": "x"}, None, 1]),
        "is_error": json_values,
    },
)
messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user"] * 4 + ["assistant"] * 3 + ["system", 3]),
            "content": st.text(max_size=5) | st.lists(blocks, min_size=1, max_size=3),
        },
    )
    | st.fixed_dictionaries({}, optional={"role": json_values, "content": json_values, "name": json_values}),
    min_size=1,
    max_size=4,
)
bodies = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["m"] * 8 + ["", 1]),
        "max_tokens": st.sampled_from([5] * 8 + [0, -1, 10**9, "5", None, True]),
        "messages": messages,
    },
    optional={
        "system": st.text(max_size=5) | st.lists(blocks, max_size=2) | json_values,
        "tools": st.lists(
            st.fixed_dictionaries({}, optional={"name": json_values, "input_schema": json_values, "type": json_values}),
            max_size=2,
        )
        | json_values,
        "tool_choice": st.fixed_dictionaries(
            {"type": st.sampled_from(["auto", "any", "tool", "none", "x"])},
            optional={"name": json_values, "disable_parallel_tool_use": json_values},
        )
        | json_values,
        "stop_sequences": json_values,
        "temperature": json_values,
        "top_k": json_values,
        "metadata": json_values,
        "stream": st.booleans() | json_values,
    },
)


@given(body=bodies)
@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_any_body_is_a_400_or_a_chat_request_the_chat_path_takes(body: dict[str, Any]) -> None:
    try:
        asked = translate_request(orjson.dumps(body), LIMITS, lambda model: True)
    except ApiError as error:
        assert error.status == 400 and error.message and error.param
        return
    parse_chat_request(orjson.dumps(asked.chat), LIMITS)  # raises (a 422) if the face let through what it refuses


@given(chat=json_values)
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_any_chat_answer_translates(chat: Any) -> None:
    if isinstance(chat, dict):
        message = whole_message(chat, "m", ())
        assert message["type"] == "message" and isinstance(message["content"], list)
