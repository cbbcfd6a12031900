"""What each row of the table runs: the stub itself, spillgate in front of it, sglang-router in front of it."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

STUB_MODEL = "bench-model"
ROUTE = "chat"
API_KEY = "sk-spillgate-bench"


@dataclass(frozen=True)
class Target:
    """A row: its name, the port clients call and what they put in ``model`` and ``authorization``."""

    name: str
    port: int
    model: str
    api_key: str | None = None


def stub_argv(port: int) -> list[str]:
    return [sys.executable, "-m", "tests.bench.stub_backend", "--port", str(port), "--model", STUB_MODEL]


def gateway_config(stub_port: int, port: int, access_log: str = "json") -> dict[str, object]:
    """One pool on the stub, one route, one tenant: auth, validation and the policy are all on the path.

    The key is stored as a digest, as a real deployment would; health probes every 5 s stay off the path.
    ``access_log`` is the log's format, or ``off``.
    """
    logging = {"access_log": False} if access_log == "off" else {"access_log": True, "format": access_log}
    return {
        "logging": logging,
        "listen": {"host": "127.0.0.1", "port": port},
        "health": {"interval_s": 5},
        "limits": {"max_connections_per_client": 0},  # wrk and the load generator are one address
        "pools": [{"name": "stub", "served_model": STUB_MODEL, "replicas": [f"http://127.0.0.1:{stub_port}"]}],
        "routes": [{"name": ROUTE, "targets": ["stub"], "policy": "least_load"}],
        "tenants": [{"name": "bench", "keys": ["sha256:" + hashlib.sha256(API_KEY.encode()).hexdigest()]}],
    }


def gateway_argv(config_path: Path, stub_port: int, port: int, access_log: str = "json") -> list[str]:
    config_path.write_text(yaml.safe_dump(gateway_config(stub_port, port, access_log), sort_keys=False))
    return [sys.executable, "-m", "spillgate.gateway.cli", "serve", "--config", str(config_path), "--port", str(port)]


def router_argv(python: str, stub_port: int, port: int, prometheus_port: int) -> list[str]:
    """sglang-router with its defaults but for a quiet log and a metrics port that cannot collide."""
    return [
        python,
        "-m",
        "sglang_router.launch_router",
        "--worker-urls",
        f"http://127.0.0.1:{stub_port}",
        "--policy",
        "round_robin",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warn",
        "--prometheus-port",
        str(prometheus_port),
    ]
