"""A route's complexity model and share in the config: validated at start and on every edit, naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spillgate.gateway.control.config import ConfigError, parse_config
from spillgate.gateway.control.routes import build_routes

BASE: dict[str, Any] = {
    "pools": [{"name": "replicas", "served_model": "m", "replicas": ["http://127.0.0.1:9"]}],
    "hosted_models": [{"name": "frontier", "model": "openai/x", "input_per_mtok": 1, "output_per_mtok": 2, "tier": 2}],
    "auth": {"required": False},
}


def config_with(spill: dict[str, Any]) -> dict[str, Any]:
    return {**BASE, "routes": [{"name": "auto", "targets": ["replicas", "frontier"], "spill": spill}]}


def test_a_route_names_the_shipped_model_and_a_share_turned_into_its_threshold() -> None:
    config = parse_config(config_with({"complexity_model": "routellm", "complexity_share": 0.2}), source="t")
    route = build_routes(config, {"replicas": ["replicas-0"], "frontier": ["frontier"]}, {})["auto"]
    assert route.classifier is not None and route.complexity_threshold is not None
    assert 0 < route.complexity_threshold < 1
    assert route.classifier.score({"messages": [{"role": "user", "content": "hi"}]}).score < route.complexity_threshold


@pytest.mark.parametrize(
    ("spill", "message"),
    [
        ({"complexity_model": "{tmp}/missing.json"}, "routes.0.spill.complexity_model"),
        ({"complexity_model": "{tmp}/bad.json"}, "routes.0.spill.complexity_model"),
        ({"complexity_share": 0.2}, "complexity_share needs complexity_model"),
        ({"complexity_model": "routellm", "complexity_share": 0.2, "complexity_threshold": 0.3}, "not both"),
    ],
)
def test_a_bad_model_file_or_share_is_a_config_error_naming_the_field(
    tmp_path: Path, spill: dict[str, Any], message: str
) -> None:
    (tmp_path / "bad.json").write_text("{nope")
    spill = {k: v.replace("{tmp}", str(tmp_path)) if isinstance(v, str) else v for k, v in spill.items()}
    with pytest.raises(ConfigError, match=message):
        parse_config(config_with(spill), source="t")
