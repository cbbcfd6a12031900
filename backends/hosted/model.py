"""A hosted model as the gateway configures it: which litellm model, where, with which credentials."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spillgate.backends.hosted.pricing import Price, PriceOverride, price_for

# Extra litellm arguments whose values are credentials (Bedrock, Azure, Vertex): scrubbed like api_key.
_SECRET_PARAM_WORDS = ("key", "secret", "token", "password", "credential")


@dataclass(frozen=True)
class HostedModel:
    """One hosted model. Credentials are resolved by the caller (``os.environ/NAME``) and never repr'd.

    ``litellm_model`` is litellm's name (``openai/gpt-4o``, ``anthropic/claude-sonnet-4-5``,
    ``bedrock/...``); with ``api_base`` an ``openai/`` model is any OpenAI-compatible service.
    ``timeout_s`` is the longest silence allowed before or within a response; ``params`` are extra
    litellm arguments from the config (``aws_region_name``, ``api_version``, ...). ``price`` comes from
    ``pricing.price_for`` at config load; without it the cost is looked up per request or left unknown.
    """

    name: str
    litellm_model: str
    api_base: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 300.0
    connect_timeout_s: float = 5.0
    params: Mapping[str, Any] = field(default_factory=dict, repr=False)
    price: Price | None = None

    def secrets(self) -> tuple[str, ...]:
        """Every credential this model holds, for scrubbing text before it leaves the package."""
        found = [self.api_key] if self.api_key else []
        for key, value in self.params.items():
            if isinstance(value, str) and any(word in key.lower() for word in _SECRET_PARAM_WORDS):
                found.append(value)
        return tuple(found)

    def with_price(self, override: PriceOverride | None = None) -> HostedModel:
        """This model with its price resolved (raises UnknownModelPrice): call it at config load."""
        return dataclasses.replace(self, price=price_for(self.litellm_model, override))
