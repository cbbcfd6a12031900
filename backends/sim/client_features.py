"""What a chat request asks of its reply beyond free text: a forced tool call or JSON, per choice.

Both engines force these with a grammar. With ``tool_choice`` ``"required"`` the model writes a JSON array of
``{"name", "parameters"}`` (SGLang's ``get_json_schema_constraint``, vLLM's ``_get_json_schema_from_tool``); with a
named tool vLLM has it write only the arguments object, SGLang the same one-element array. The simulator writes that
text itself (``structured.py``) and streams it token by token, so timing and token counts follow it; the routes turn
it into ``tool_calls`` as each engine's parser does.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spillgate.backends.sim import structured

ARRAY_OPEN = '[{"name": '


@dataclass(frozen=True)
class ToolCallPlan:
    """The call a choice will make: the tool's name and its arguments as JSON text."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ChoicePlan:
    """A choice's reply fixed in advance (None: free words), and the tool call it holds, if any."""

    script: str | None = None
    call: ToolCallPlan | None = None
    arguments_start: int = 0
    """Where the arguments begin in ``script`` (how far the text must get before they stream)."""


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    function = tool.get("function")
    return function if isinstance(function, Mapping) else {}


def forced_tools(tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any) -> list[Mapping[str, Any]] | None:
    """The tools one of which must be called (None when the model may answer in text); a ValueError names a tool
    choice that is not among the tools."""
    if not tools:
        return None
    if tool_choice == "required":
        return list(tools)
    if isinstance(tool_choice, Mapping):
        name = (tool_choice.get("function") or {}).get("name")
        chosen = [tool for tool in tools if _function(tool).get("name") == name]
        if not chosen:
            raise ValueError(f"Tool '{name}' not found in 'tools'.")
        return chosen
    return None


def plan_choice(
    seed: int,
    tools: list[Mapping[str, Any]] | None,
    named: bool,
    response_format: Mapping[str, Any] | None,
    *,
    arguments_only: bool,
) -> ChoicePlan:
    """The reply of one choice seeded with ``seed``. ``arguments_only``: a named tool's reply is its arguments
    object alone (vLLM), not a one-element array (SGLang)."""
    rng = random.Random(seed ^ 0x5EED)
    if tools:
        tool = _function(rng.choice(tools))
        name = str(tool.get("name", ""))
        arguments = structured.dumps(structured.sample(tool.get("parameters") or {"type": "object"}, rng))
        call = ToolCallPlan(name, arguments)
        if named and arguments_only:
            return ChoicePlan(arguments, call, 0)
        head = f"{ARRAY_OPEN}{structured.dumps(name)}, " + '"parameters": '
        return ChoicePlan(head + arguments + "}]", call, len(head))
    if response_format:
        text = structured.response_format_text(response_format, rng)
        if text is not None:
            return ChoicePlan(text)
    return ChoicePlan()


def streamed_arguments(plan: ChoicePlan, text: str) -> str:
    """How much of the call's arguments ``text`` (the reply so far) holds."""
    if plan.call is None or len(text) < plan.arguments_start:
        return ""
    return text[plan.arguments_start : plan.arguments_start + len(plan.call.arguments)]


def sglang_problem(tools: list[dict[str, Any]] | None, tool_choice: Any, response_format: Any) -> str | None:
    """SGLang's refusals of these fields (``serving_chat.py: _validate_request``), or None."""
    if tool_choice == "required" and not tools:
        return "Tools cannot be empty if tool choice is set to required."
    if isinstance(tool_choice, Mapping):
        if not tools:
            return "Tools cannot be empty if tool choice is set to a specific tool."
        name = (tool_choice.get("function") or {}).get("name")
        if not any(_function(tool).get("name") == name for tool in tools):
            return f"Tool '{name}' not found in tools list."
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping) or spec.get("schema", spec.get("schema_")) is None:
            return "schema_ is required for json_schema response format request."
    return None


def vllm_problem(payload: Mapping[str, Any]) -> tuple[str, str] | None:
    """vLLM's refusals of these fields (``chat_completion/protocol.py`` validators): message and parameter."""
    tools, tool_choice = payload.get("tools"), payload.get("tool_choice")
    if tools == []:
        return (
            "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.",
            "tools",
        )
    if tool_choice is not None and tool_choice != "none":
        if tools is None:
            return "When using `tool_choice`, `tools` must be set.", "tool_choice"
        if tool_choice not in ("auto", "required") and not isinstance(tool_choice, Mapping):
            return (
                f"Invalid value for `tool_choice`: {tool_choice}! "
                'Only named tools, "none", "auto" or "required" are supported.',
                "tool_choice",
            )
        if isinstance(tool_choice, Mapping):
            name = (tool_choice.get("function") or {}).get("name")
            if not any(_function(tool).get("name") == name for tool in tools if isinstance(tool, Mapping)):
                return "The tool specified in `tool_choice` does not match any of the specified `tools`", "tool_choice"
    response_format = payload.get("response_format")
    rf_type = response_format.get("type") if isinstance(response_format, Mapping) else None
    if rf_type == "json_schema" and response_format.get("json_schema") is None:  # type: ignore[union-attr]
        return (
            "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
            "response_format",
        )
    top = payload.get("top_logprobs")
    if isinstance(top, int):
        if top < 0 and top != -1:
            return "`top_logprobs` must be a positive value or -1.", "top_logprobs"
        if (top == -1 or top > 0) and not payload.get("logprobs"):
            return "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
    return None


def vllm_parser_problem(payload: Mapping[str, Any], parser: str | None, auto_enabled: bool) -> str | None:
    """vLLM's refusal of a tool choice it cannot parse (``renderers/online_renderer.py``): it builds its tool parser
    only with both ``--enable-auto-tool-choice`` and ``--tool-call-parser`` (``parser/parser_manager.py``), and
    ``tool_choice`` defaults to "auto" when tools are sent."""
    tool_choice = payload.get("tool_choice", "auto" if payload.get("tools") else None)
    if (parser is not None and auto_enabled) or tool_choice in (None, "none"):
        return None
    if tool_choice == "auto":
        return '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
    if isinstance(tool_choice, Mapping):
        described = f'function "{(tool_choice.get("function") or {}).get("name")}"'
    else:
        described = f'"{tool_choice}"'
    return f"tool_choice={described} requires --tool-call-parser to be set"
