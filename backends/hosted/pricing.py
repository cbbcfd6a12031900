"""What a hosted request costs: litellm's bundled price map, with per-model overrides from the config.

The map is the one shipped inside the installed litellm package (``runtime`` forbids fetching it), so
prices change only when litellm is upgraded. Prices are per token here; overrides are per million
tokens, as providers publish them. Cached input tokens are part of ``prompt_tokens`` (OpenAI's
convention, and litellm's for Anthropic), billed at the cached price instead of the input price.

Anthropic's models also bill cache writes: the prompt tokens a request with ``cache_control`` wrote to the
cache cost 1.25 times the input price (reads 0.1 times). litellm counts both in ``prompt_tokens`` (its
Anthropic usage adds ``cache_read_input_tokens`` and ``cache_creation_input_tokens`` to Anthropic's
``input_tokens``), so a request's prompt is split three ways: read, written, and the rest at the input price.
Where neither the map nor the config prices them, an Anthropic model's reads and writes take Anthropic's
ratios to its input price.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MTOK = 1_000_000
_MAP_FIELDS = (
    "input_cost_per_token",
    "output_cost_per_token",
    "cache_read_input_token_cost",
    "cache_creation_input_token_cost",
)
ANTHROPIC_CACHE_READ = 0.1
ANTHROPIC_CACHE_WRITE = 1.25
"""Anthropic's cache prices as multiples of the input price (writes with the default five-minute lifetime)."""


class UnknownModelPrice(LookupError):
    """The model is not in litellm's bundled price map and the config gives no price for it."""


@dataclass(frozen=True)
class Price:
    """USD per token."""

    input: float
    output: float
    cached_input: float

    @property
    def cache_write_input(self) -> float:
        """USD per token written to the prompt cache: the input price for a provider that bills no writes."""
        return self.input

    def cost(
        self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0, cache_write_tokens: int = 0
    ) -> float:
        """USD for one request; ``cached_tokens`` is the part of ``prompt_tokens`` read from the cache,
        ``cache_write_tokens`` the part written to it."""
        cached = min(max(cached_tokens, 0), prompt_tokens)
        written = min(max(cache_write_tokens, 0), prompt_tokens - cached)
        rest = prompt_tokens - cached - written
        return (
            rest * self.input
            + cached * self.cached_input
            + written * self.cache_write_input
            + completion_tokens * self.output
        )


@dataclass(frozen=True)
class CacheWritingPrice(Price):
    """The price of a model whose provider bills cache writes apart (Anthropic's, wherever they are hosted)."""

    cache_write: float

    @property
    def cache_write_input(self) -> float:
        return self.cache_write


@dataclass(frozen=True)
class PriceOverride:
    """A hosted model's prices from the config, USD per million tokens; None keeps the map's price."""

    input_per_mtok: float | None = None
    output_per_mtok: float | None = None
    cached_input_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None


def price_for(model_key: str, override: PriceOverride | None = None) -> Price:
    """The price to charge: the map's, field by field replaced by the override; raises UnknownModelPrice.

    ``model_key`` is litellm's model name, looked up as litellm does (``openai/gpt-4o`` finds ``gpt-4o``).
    Without a cached-input price (in the map or the override) cached tokens cost the input price, or a tenth of it
    for an Anthropic model; an Anthropic model's cache writes cost 1.25 times the input price unless priced.
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
    written = _per_token(override.cache_write_per_mtok, mapped[3])
    anthropic = is_anthropic(model_key)
    if cached is None:
        cached = prompt * ANTHROPIC_CACHE_READ if anthropic else prompt
    if written is None and anthropic:
        written = prompt * ANTHROPIC_CACHE_WRITE
    if written is None:
        return Price(prompt, completion, cached)
    return CacheWritingPrice(prompt, completion, cached, written)


def is_anthropic(model_key: str) -> bool:
    """Whether ``model_key`` names one of Anthropic's models (on Anthropic's API, Bedrock or Vertex)."""
    from spillgate.backends.hosted.runtime import litellm  # imported on first use: it takes seconds

    try:
        provider = str(litellm.get_llm_provider(model_key)[1])
    except Exception:  # litellm raises its BadRequestError, and others, for a model it cannot place
        provider = ""
    return provider == "anthropic" or "claude" in model_key.lower()


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
    cache_write_tokens: int = 0,
) -> float:
    """USD for one request to ``model_key``; raises UnknownModelPrice as ``price_for`` does."""
    return price_for(model_key, override).cost(prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens)


def _per_token(per_mtok: float | None, mapped: float | None) -> float | None:
    return mapped if per_mtok is None else per_mtok / MTOK


def _mapped_per_token(model_key: str) -> tuple[float | None, ...]:
    """(input, output, cached input, cache write) USD per token from the bundled map; None where it has no figure."""
    from spillgate.backends.hosted.runtime import litellm  # imported on first use: it takes seconds

    try:
        info: dict[str, Any] = dict(litellm.get_model_info(model_key))
    except Exception:  # litellm raises a bare Exception subclass for "not mapped"
        return (None,) * len(_MAP_FIELDS)
    return tuple(None if info.get(name) is None else float(info[name]) for name in _MAP_FIELDS)


def _litellm_version() -> str:
    from importlib.metadata import version

    return version("litellm")
