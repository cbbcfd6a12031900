"""Running a real gateway process over a config a test writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.support.procs import RunningProcess, free_port, start_spillgate

TENANT_KEY = "sk-test-tenant"
OTHER_KEY = "sk-test-other"


def gateway_config(replica_urls: list[str], **overrides: Any) -> dict[str, Any]:
    """A config with one pool over ``replica_urls``, routes ``chat`` (least_load) and ``chat-rr``."""
    config: dict[str, Any] = {
        "pools": [{"name": "pool", "served_model": "sim-model", "replicas": replica_urls}],
        "routes": [
            {"name": "chat", "targets": ["pool"], "policy": "least_load"},
            {"name": "chat-rr", "targets": ["pool"], "policy": "round_robin"},
        ],
        "tenants": [
            {"name": "tenant-a", "keys": [TENANT_KEY]},
            {"name": "tenant-b", "keys": [OTHER_KEY], "routes": ["chat-rr"]},
        ],
        "health": {"interval_s": 0.2, "timeout_s": 1.0, "unhealthy_after": 1},
    }
    config.update(overrides)
    return config


def start_gateway(config: dict[str, Any], tmp_path: Path, *, ready_path: str = "/health") -> RunningProcess:
    port = free_port()
    config = {**config, "state": {"data_dir": str(tmp_path / f"data-{port}"), **config.get("state", {})}}
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"gateway-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    return start_spillgate(
        ["serve", "--config", str(path), "--port", str(port)], port=port, log_dir=tmp_path, ready_path=ready_path
    )


def start_replica(tmp_path: Path, *args: str, port: int | None = None) -> RunningProcess:
    port = port or free_port()
    return start_spillgate(
        ["sim-replica", "--port", str(port), "--model-name", "sim-model", *args], port=port, log_dir=tmp_path
    )
