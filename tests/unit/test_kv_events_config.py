"""A pool's ``kv_events`` template with data-parallel ranks: refused with the field named where the ports cannot
work, and carried to each replica's event source where they can."""

from __future__ import annotations

from typing import Any

import pytest

from spillgate.gateway.control.catalog import Endpoints, build_catalog
from spillgate.gateway.control.config import ConfigError, parse_config


def raw(kv_events: dict[str, Any]) -> dict[str, Any]:
    pool = {"name": "p", "served_model": "m", "replicas": ["http://10.0.0.1:30000"], "kv_events": kv_events}
    return {"pools": [pool], "routes": [{"name": "r", "targets": ["p"]}], "auth": {"required": False}}


@pytest.mark.parametrize(
    ("kv_events", "expected"),
    [
        ({"dp_size": 2}, "dp_size needs endpoint"),
        ({"endpoint": "tcp://{host}:5557", "replay_endpoint": "tcp://{host}:5558", "dp_size": 2}, "overlap"),
        ({"endpoint": "tcp://{host}:65535", "dp_size": 2}, "past 65535"),
        ({"endpoint": "tcp://{host}:5557", "dp_size": 0}, "dp_size"),
    ],
)
def test_ranks_that_cannot_publish_there_are_refused_naming_the_field(kv_events: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(raw(kv_events))
    assert "pools.0.kv_events" in str(refused.value) and expected in str(refused.value)


def test_the_ranks_reach_each_replicas_event_source() -> None:
    events = {"endpoint": "tcp://{host}:5557", "replay_endpoint": "tcp://{host}:5600", "dp_size": 4}
    (backend,) = build_catalog(parse_config(raw(events)), Endpoints({}, {}), {}).backends
    assert backend.kv_events is not None
    assert (backend.kv_events.endpoint, backend.kv_events.replay_endpoint) == (
        "tcp://10.0.0.1:5557",
        "tcp://10.0.0.1:5600",
    )
    assert backend.kv_events.ranks == 4


def test_without_dp_size_the_replica_says_how_many() -> None:
    (backend,) = build_catalog(parse_config(raw({"endpoint": "tcp://{host}:5557"})), Endpoints({}, {}), {}).backends
    assert backend.kv_events is not None and backend.kv_events.ranks is None
