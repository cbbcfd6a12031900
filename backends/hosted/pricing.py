"""What a hosted request costs: litellm's bundled price map, with per-model overrides from the config.

The map is the one shipped inside the installed litellm package (``runtime`` forbids fetching it), so
prices change only when litellm is upgraded. Prices are per token here; overrides are per million
tokens, as providers publish them. Cached input tokens are part of ``prompt_tokens`` (OpenAI's
convention, and litellm's for Anthropic), billed at the cached price instead of the input price.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MTOK = 1_000_000
_MAP_FIELDS = ("input_cost_per_token", "output_cost_per_token", "cache_read_input_token_cost")


class UnknownModelPrice(LookupError):
    """The model is not in litellm's bundled price map and the config gives no price for it."""


@dataclass(frozen=True)
class Price:
    """USD per token."""

    input: float
    output: float
    cached_input: float

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """USD for one request; ``cached_tokens`` is the part of ``prompt_tokens`` read from the cache."""
        cached = min(max(cached_tokens, 0), prompt_tokens)
        return (prompt_tokens - cached) * self.input + cached * self.cached_input + completion_tokens * self.output


@dataclass(frozen=True)
class PriceOverride:
    """A hosted model's prices from the config, USD per million tokens; None keeps the map's price."""

    input_per_mtok: float | None = None
    output_per_mtok: float | None = None
    cached_input_per_mtok: float | None = None


def price_for(model_key: str, override: PriceOverride | None = None) -> Price:
    """The price to charge: the map's, field by field replaced by the override; raises UnknownModelPrice.

    ``model_key`` is litellm's model name, looked up as litellm does (``openai/gpt-4o`` finds ``gpt-4o``).
    Without a cached-input price (in the map or the override) cached tokens cost the input price.
    """
    override = override or PriceOverride()
    mapped = _mapped_per_token(model_key)
    prompt = _per_token(override.input_per_mtok, mapped[0])
    completion = _per_token(override.output_per_mtok, mapped[1])
    if prompt is None or completion is None:
        raise UnknownModelPrice(
            f"no price for hosted model {model_key!r}: it is not in the price map bundled with litellm "
            f"{_litellm_version()}; set input_per_mtok and output_per_mtok (and cached_input_per_mtok) "
            "for it in the config"
        )
    cached = _per_token(override.cached_input_per_mtok, mapped[2])
    return Price(prompt, completion, prompt if cached is None else cached)


def bundled_price(model_key: str) -> Price | None:
    """The price in litellm's bundled map alone, or None when the map has none."""
    try:
        return price_for(model_key)
    except UnknownModelPrice:
        return None


def cost(
    model_key: str,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
    override: PriceOverride | None = None,
) -> float:
    """USD for one request to ``model_key``; raises UnknownModelPrice as ``price_for`` does."""
    return price_for(model_key, override).cost(prompt_tokens, completion_tokens, cached_tokens)


def _per_token(per_mtok: float | None, mapped: float | None) -> float | None:
    return mapped if per_mtok is None else per_mtok / MTOK


def _mapped_per_token(model_key: str) -> tuple[float | None, ...]:
    """(input, output, cached input) USD per token from the bundled map; None where it has no figure."""
    from spillgate.backends.hosted.runtime import litellm  # imported on first use: it takes seconds

    try:
        info: dict[str, Any] = dict(litellm.get_model_info(model_key))
    except Exception:  # litellm raises a bare Exception subclass for "not mapped"
        return (None, None, None)
    return tuple(None if info.get(name) is None else float(info[name]) for name in _MAP_FIELDS)


def _litellm_version() -> str:
    from importlib.metadata import version

    return version("litellm")
