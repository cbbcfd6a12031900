"""A ``/v1/responses`` request as both engines read it: its fields, and its input items turned into chat messages.

SGLang 0.5.23 and vLLM 0.32 answer the Responses API by rendering a chat conversation (``serving_responses.py``:
``_construct_input_messages``; ``responses/utils.py``: ``construct_input_messages``): the request's
``instructions`` as the system turn, then a stored conversation named by ``previous_response_id`` (its system turns
left out: instructions do not carry over), then the new input. A plain string is one user turn; message items keep
their role and the text of their content parts; a ``function_call`` is an assistant turn calling the tool and its
``function_call_output`` a tool turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from spillgate.backends.sim.protocol import stop_strings

Message = dict[str, Any]
"""A chat message as the simulator's chat template takes it: ``role``, ``content`` text, maybe ``tool_calls``."""

_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


class ResponsesBody(BaseModel):
    """The request fields either engine acts on or echoes; like theirs, unknown fields are accepted and dropped."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    store: bool | None = True
    stream: bool | None = False
    background: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    ignore_eos: bool = False
    metadata: dict[str, Any] | None = None
    tools: list[dict[str, Any]] = []
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool | None = True
    truncation: str | None = "disabled"
    user: str | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    service_tier: str = "auto"
    include: list[str] | None = None
    top_logprobs: int | None = 0
    max_tool_calls: int | None = None
    request_id: str | None = None
    cache_salt: str | None = None
    extra_key: str | None = None
    priority: int | None = None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return stop_strings(self.stop)

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.include and "message.output_text.logprobs" in self.include)


def content_text(content: Any) -> str:
    """The text of a message's content: a string, or its text parts joined (an image stands as its type)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    pieces = []
    for part in content:
        if not isinstance(part, Mapping):
            continue
        if part.get("type") in _TEXT_PARTS:
            pieces.append(str(part.get("text") or part.get("refusal") or ""))
        elif part.get("type"):
            pieces.append(f"<{part['type']}>")
    return "".join(pieces)


def input_messages(items: str | Sequence[Mapping[str, Any]]) -> list[Message]:
    """The request's ``input`` as chat messages; items that carry no turn (reasoning, item references) drop out."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[Message] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message" or ("role" in item and "type" not in item):
            messages.append({"role": str(item.get("role", "user")), "content": content_text(item.get("content"))})
        elif kind == "function_call":
            function = {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}
            call = {"id": item.get("call_id"), "type": "function", "function": function}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else content_text(output)
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
    return messages


def conversation(instructions: str | None, history: Sequence[Message], new: Sequence[Message]) -> list[Message]:
    """What the model is shown: one leading system turn (the instructions and any system or developer turns of the
    new input, as SGLang coalesces them for templates that take one), then the stored turns and the new ones."""
    system = [instructions] if instructions else []
    turns: list[Message] = list(history)
    for message in new:
        if message.get("role") in ("system", "developer"):
            system.append(str(message.get("content") or ""))
        else:
            turns.append(message)
    return ([{"role": "system", "content": "\n\n".join(system)}] if system else []) + turns


def chat_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """Responses function tools (``{"type": "function", "name", "parameters"}``) in the chat shape the template
    renders; built-in tools (web search, MCP) have no definition to show."""
    functions = [
        {
            "type": "function",
            "function": {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool},
        }
        for tool in tools
        if tool.get("type") == "function"
    ]
    return functions or None
