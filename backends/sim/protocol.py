"""Request bodies of the SGLang endpoints, with SGLang's field names and defaults.

Only fields the simulator acts on are declared; like SGLang's pydantic models, unknown fields
are accepted and ignored. Validation failures become HTTP 400 in the error shape SGLang uses.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_MODEL_NAME = "default"
_ROLES = ("system", "user", "assistant", "tool", "function", "developer")


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class ChatMessage(_Body):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @field_validator("role")
    @classmethod
    def _known_role(cls, role: str) -> str:
        role = role.lower()
        if role not in _ROLES:
            raise ValueError(f"'role' must be one of {', '.join(repr(r) for r in _ROLES)} (case-insensitive).")
        return role


class _OpenAIRequest(_Body):
    model: str = DEFAULT_MODEL_NAME
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    ignore_eos: bool = False
    user: str | None = None
    rid: str | None = None
    extra_key: str | None = None
    cache_salt: str | None = None
    priority: int | None = None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return stop_strings(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage_stats(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


class ChatCompletionRequest(_OpenAIRequest):
    messages: list[ChatMessage]
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    input_ids: list[int] | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    continue_final_message: bool = False

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_OpenAIRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = 16
    echo: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    logprobs: int | None = None

    @field_validator("max_tokens")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value is not None and value <= 0:
            raise ValueError("max_tokens must be positive")
        return value

    def single_prompt(self) -> str | list[int]:
        """The prompt as text or token ids; a batch of prompts (a ValueError) is not supported."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise ValueError("The simulator supports a single prompt per request.")
            return prompt[0]  # type: ignore[return-value]
        return prompt  # type: ignore[return-value]


class SamplingParams(_Body):
    max_new_tokens: int | None = Field(default=None, ge=0)
    ignore_eos: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True


class GenerateRequest(_Body):
    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: SamplingParams | None = None
    rid: str | None = None
    stream: bool = False
    return_logprob: bool = False
    log_metrics: bool = True
    extra_key: str | None = None
    cache_salt: str | None = None
    priority: int | None = None


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    """A request's ``stop`` as a tuple of non-empty strings."""
    listed = [stop] if isinstance(stop, str) else stop or []
    return tuple(s for s in listed if s)
