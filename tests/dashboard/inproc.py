"""A gateway built in this process, for tests that need to reach into its state: metrics set by hand and a
fake cost ledger at ``state.spend``. Replicas point at a closed port; nothing is proxied."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn

from spillgate.gateway.app import GatewayApp
from spillgate.gateway.control.config import parse_config
from spillgate.gateway.state import GatewayState, build_state
from tests.support.gateway import replica_name
from tests.support.procs import free_port

ADMIN_KEY = "sk-inproc-admin"
KEYS = {"tenant-a": "sk-inproc-a", "tenant-b": "sk-inproc-b", "vip": "sk-inproc-vip"}
SHARED_URLS = ("http://127.0.0.1:9", "http://127.0.0.2:9")
VIP_URL = "http://127.0.0.3:9"
"""The discard port: nothing listens, so probes fail fast and the replicas read as unhealthy."""
SHARED = tuple(replica_name(url, "shared") for url in SHARED_URLS)
"""The names of pool ``shared``'s two replicas."""
VIP = replica_name(VIP_URL, "vip-pool")
METRICS_TOKEN = "sk-inproc-metrics"


def config() -> dict[str, Any]:
    return {
        "pools": [
            {"name": "shared", "served_model": "m", "replicas": list(SHARED_URLS)},
            {"name": "vip-pool", "served_model": "m", "replicas": [VIP_URL]},
        ],
        "routes": [{"name": "chat", "targets": ["shared", "vip-pool"], "policy": "least_load"}],
        "tenants": [
            {"name": "tenant-a", "keys": [KEYS["tenant-a"]], "slo": {"name": "gold", "ttft_ms": 500}},
            {"name": "tenant-b", "keys": [KEYS["tenant-b"]], "slo": {"name": "silver", "ttft_ms": 900}},
            {"name": "vip", "keys": [KEYS["vip"]], "isolation": "dedicated", "dedicated_pools": ["vip-pool"]},
        ],
        "admin": {"keys": [ADMIN_KEY]},
        "metrics": {"tenant_labels": True, "token": METRICS_TOKEN},
        "health": {"interval_s": 60, "timeout_s": 0.2, "unhealthy_after": 1},
    }


def state() -> GatewayState:
    parsed = parse_config(config())
    return build_state(parsed, {}, {})


def record_traffic(gateway: GatewayState) -> None:
    """Metrics as the proxy would count them: every tenant, a dedicated replica, two SLO classes."""
    m = gateway.metrics
    m.requests.labels("chat", SHARED[0], "ok", "least_load").inc(3)
    m.requests.labels("chat", VIP, "ok", "least_load").inc(2)
    for backend, seconds in ((SHARED[0], 0.04), (SHARED[0], 0.3), (SHARED[1], 0.02), (VIP, 0.7)):
        m.ttft.labels(backend).observe(seconds)
        m.tpot.labels(backend).observe(seconds / 20)
    m.prompt_tokens.labels(SHARED[0], "prompt").inc(1000)
    m.prompt_tokens.labels(SHARED[0], "cached").inc(400)
    m.prompt_tokens.labels(VIP, "prompt").inc(500)
    for tenant, usd in (("tenant-a", 0.25), ("tenant-b", 0.5), ("vip", 1.0)):
        m.spend.labels(tenant, "chat", SHARED[0], "replica", "least_load").inc(usd)
    m.slo.labels("gold", "met").inc(2)
    m.slo.labels("silver", "ttft_missed").inc(1)


class FakeLedger:
    """The ledger's interface, answering from fixed rows; records what it was asked."""

    def __init__(self, now: float, bucket_s: int = 60) -> None:
        start = (int(now) // bucket_s) * bucket_s
        self.rows = [
            {
                "t": start - bucket_s * i,
                "tenant": tenant,
                "kind": kind,
                "usd": usd * (i + 1),
                "hosted_equivalent_usd": usd * 4,
            }
            for i in range(5)
            for tenant, kind, usd in (
                ("tenant-a", "replica", 0.01),
                ("tenant-a", "hosted", 0.02),
                ("tenant-b", "hosted", 0.5),
            )
        ]
        self.calls: list[tuple[str, Any]] = []

    def series(self, tenant: str | None, bucket_s: int, since_s: float) -> list[dict[str, Any]]:
        self.calls.append(("series", (tenant, bucket_s, since_s)))
        return [dict(r) for r in self.rows if tenant in (None, r["tenant"]) and r["t"] >= since_s]

    def totals(self, tenant: str | None) -> dict[str, Any]:
        self.calls.append(("totals", tenant))
        rows = [r for r in self.rows if tenant in (None, r["tenant"])]
        return {
            "window": "month",
            "usd": sum(r["usd"] for r in rows),
            "hosted_equivalent_usd": sum(r.get("hosted_equivalent_usd", 0.0) for r in rows),
        }


def use_ledger(monkeypatch: pytest.MonkeyPatch, ledger: object | None) -> None:
    """Make ``state.spend`` answer with ``ledger`` (None: no ledger), however the state defines it."""
    monkeypatch.setattr(GatewayState, "spend", property(lambda _state: ledger), raising=False)


@contextmanager
def serving(gateway: GatewayState) -> Iterator[str]:
    """The app on a free port in a background thread; its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(GatewayApp(gateway), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("in-process gateway did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
