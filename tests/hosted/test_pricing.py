"""Prices from litellm's bundled map, per-model overrides, and the error for a model without a price."""

from __future__ import annotations

from dataclasses import astuple

import pytest

from spillgate.backends.hosted import HostedModel, Price, PriceOverride, UnknownModelPrice
from spillgate.backends.hosted.pricing import bundled_price, cost, price_for


def test_bundled_prices_are_found_the_way_litellm_finds_them() -> None:
    gpt = bundled_price("openai/gpt-4o")
    assert gpt is not None and gpt == bundled_price("gpt-4o")
    assert 0 < gpt.cached_input < gpt.input < gpt.output < 1e-3
    claude = bundled_price("anthropic/claude-sonnet-4-5")
    assert claude is not None and claude.cached_input < claude.input


def test_cost_charges_cached_tokens_at_the_cached_price() -> None:
    price = Price(input=2e-6, output=8e-6, cached_input=0.5e-6)
    assert price.cost(1000, 100) == pytest.approx(1000 * 2e-6 + 100 * 8e-6)
    assert price.cost(1000, 100, cached_tokens=600) == pytest.approx(400 * 2e-6 + 600 * 0.5e-6 + 100 * 8e-6)
    assert price.cost(10, 0, cached_tokens=50) == pytest.approx(10 * 0.5e-6)  # never more cached than prompt
    gpt = price_for("openai/gpt-4o")
    assert cost("openai/gpt-4o", 1000, 100, 600) == pytest.approx(gpt.cost(1000, 100, 600))


def test_overrides_replace_the_maps_prices_field_by_field() -> None:
    mapped = price_for("openai/gpt-4o")
    overridden = price_for("openai/gpt-4o", PriceOverride(output_per_mtok=20.0))
    assert overridden == Price(mapped.input, 20e-6, mapped.cached_input)


def test_a_model_missing_from_the_map_needs_input_and_output_prices() -> None:
    with pytest.raises(UnknownModelPrice, match=r"'openai/in-house-70b'.*input_per_mtok and output_per_mtok"):
        price_for("openai/in-house-70b")
    with pytest.raises(UnknownModelPrice):
        price_for("openai/in-house-70b", PriceOverride(input_per_mtok=1.0))
    assert bundled_price("openai/in-house-70b") is None
    price = price_for("openai/in-house-70b", PriceOverride(input_per_mtok=1.0, output_per_mtok=3.0))
    assert price == Price(1e-6, 3e-6, 1e-6)  # no cached price: cached tokens cost the input price


def test_a_hosted_model_is_priced_at_config_load() -> None:
    model = HostedModel("in-house", "openai/in-house-70b", api_base="http://127.0.0.1:1/v1", api_key="sk-x")
    assert model.price is None
    with pytest.raises(UnknownModelPrice):
        model.with_price()
    priced = model.with_price(PriceOverride(input_per_mtok=1.0, output_per_mtok=3.0, cached_input_per_mtok=0.1))
    assert priced.price is not None and priced.api_key == "sk-x"
    assert astuple(priced.price) == pytest.approx((1e-6, 3e-6, 0.1e-6))
