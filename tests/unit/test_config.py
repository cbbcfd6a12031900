"""Config validation names the field and what was expected."""

from __future__ import annotations

import pytest

from gateway.config import DEMO_CONFIG_PATH, ConfigError, load_config, parse_config

MINIMAL = {
    "pools": [{"name": "p", "served_model": "m", "replicas": ["http://127.0.0.1:1"]}],
    "routes": [{"name": "r", "targets": ["p"]}],
    "auth": {"required": False},
}


def test_demo_config_is_valid() -> None:
    config = load_config(DEMO_CONFIG_PATH)
    assert config.pools[0].simulated is not None and config.pools[0].simulated.count == 4
    assert [h.name for h in config.hosted_models] == ["frontier"]


def test_minimal_config() -> None:
    assert parse_config(MINIMAL).routes[0].policy == "least_load"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"pools": [{"name": "p", "served_model": "m"}]}, "pools.0"),
        ({"routes": [{"name": "r", "targets": ["p"], "policy": "magic"}]}, "routes.0.policy"),
        ({"routes": [{"name": "r", "targets": ["nope"]}]}, "unknown target 'nope'"),
        ({"limits": {"max_body_bytes": -1}}, "limits.max_body_bytes"),
        ({"surprise": 1}, "surprise"),
        ({"auth": {"required": True}}, "no tenants"),
    ],
)
def test_errors_name_the_field(change: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({**MINIMAL, **change}, source="cfg.yaml")
    assert "cfg.yaml" in str(info.value)
    assert expected in str(info.value)


def test_not_a_mapping() -> None:
    with pytest.raises(ConfigError, match="mapping"):
        parse_config([1, 2])
