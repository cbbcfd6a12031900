"""An embeddings model outside litellm's price map needs only its input price: it produces no output."""

from __future__ import annotations

import pytest

from spillgate.gateway.control.catalog import _hosted_models
from spillgate.gateway.control.config import ConfigError, parse_config


def config(task: str) -> dict:
    embedder = {
        "name": "embedder",
        "model": "openai/house-embedder-v1",
        "api_base": "http://127.0.0.1:9/v1",
        "input_per_mtok": 0.02,
        "task": task,
    }
    return {
        "hosted_models": [embedder],
        "routes": [{"name": "embed", "targets": ["embedder"]}],
        "auth": {"required": False},
    }


def test_an_embeddings_model_is_priced_by_its_input_alone() -> None:
    models = _hosted_models(parse_config(config("embed")), {})
    price = models["embedder"].price
    assert price is not None
    assert price.cost(1_000_000, 0, 0) == pytest.approx(0.02)


def test_a_generation_model_still_needs_its_output_price() -> None:
    with pytest.raises(ConfigError) as refused:
        _hosted_models(parse_config(config("generate")), {})
    assert "hosted_models.0" in str(refused.value)
