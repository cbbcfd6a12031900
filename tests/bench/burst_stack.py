"""The processes one burst setup runs on: simulated replicas, a simulated hosted model and a gateway.

Everything the gateway is told is in wall-clock units, because that is what it measures: the simulators run
``time_scale`` x real time, so a simulated second is ``time_scale`` wall seconds, and the tenant's SLO, the
hosted model's latency priors and the replicas' prefill-rate prior are scaled to match. Every process runs in
a session of its own and is stopped by the PID it was started with.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.bench.compare_cluster import Cluster, process_cpu_s, start
from tests.bench.services import Service, free_port, http_request, wait_until

POOL = "llama-8b"
HOSTED = "frontier"
HOSTED_MODEL = "frontier-large"
API_KEY = "sk-spillgate-burst"
PREFILL_PRIOR_TOKENS_PER_S = 20000.0
"""The pool's prefill-rate prior per simulated second; the gateway learns the real one from idle TTFTs."""

# The figures, in simulated time and real prices.
SLO_TTFT_MS = 1000.0
SLO_TPOT_MS = 50.0
HOSTED_TTFT_MS = 350.0
HOSTED_TPOT_MS = 12.0
HOSTED_INPUT_PER_MTOK = 3.0
HOSTED_OUTPUT_PER_MTOK = 15.0
GPU_USD_PER_HOUR = 3.0


@dataclass(frozen=True)
class Setup:
    """One row of the comparison: which targets its route has."""

    name: str
    replicas: bool
    hosted: bool

    @property
    def targets(self) -> list[str]:
        return [POOL] * self.replicas + [HOSTED] * self.hosted


SETUPS = (
    Setup("replicas only", replicas=True, hosted=False),
    Setup("hosted only", replicas=False, hosted=True),
    Setup("spillgate", replicas=True, hosted=True),
)
ROUTE = "bench"
WARMUP_ROUTE = "warmup-hosted"
"""A route to the hosted model alone, used only before the measured run: see ``burst.run_setup``."""


@dataclass(frozen=True)
class StackSpec:
    """What every setup shares: replica count and limits, time scale, and the pool's cost figure."""

    replicas: int
    time_scale: float
    max_running: int
    output_tokens_per_s: float
    """One replica's output tokens per simulated second at capacity: GPU time is priced per output token."""


def gateway_config(spec: StackSpec, setup: Setup, port: int, replica_urls: Sequence[str], hosted_url: str | None):
    """One route over the setup's targets; SLO and hosted priors scaled to wall time (see the module doc)."""
    ts = spec.time_scale
    config: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": port},
        "health": {"interval_s": 0.5},
        "timeouts": {"read_s": 600},
        "limits": {"max_connections_per_client": 0},  # the load generator is one address with many connections
        "routes": [{"name": ROUTE, "targets": setup.targets, "policy": "cache_aware"}],
        "tenants": [
            {
                "name": "burst",
                "keys": ["sha256:" + hashlib.sha256(API_KEY.encode()).hexdigest()],
                "slo": {"ttft_ms": SLO_TTFT_MS * ts, "tpot_ms": SLO_TPOT_MS * ts},
            }
        ],
    }
    if setup.replicas:
        config["pools"] = [
            {
                "name": POOL,
                "served_model": "sim-llama-8b",
                "replicas": list(replica_urls),
                "prefill_tokens_per_s": PREFILL_PRIOR_TOKENS_PER_S / ts,
                "gpu_usd_per_hour": GPU_USD_PER_HOUR,
                "output_tokens_per_s": spec.output_tokens_per_s,
            }
        ]
    if setup.hosted:
        config["routes"].append({"name": WARMUP_ROUTE, "targets": [HOSTED]})
        config["hosted_models"] = [
            {
                "name": HOSTED,
                "model": f"openai/{HOSTED_MODEL}",
                "api_base": f"{hosted_url}/v1",
                "api_key": "any",
                "input_per_mtok": HOSTED_INPUT_PER_MTOK,
                "output_per_mtok": HOSTED_OUTPUT_PER_MTOK,
                "ttft_ms": HOSTED_TTFT_MS * ts,
                "tpot_ms": HOSTED_TPOT_MS * ts,
            }
        ]
    return config


@dataclass
class Stack:
    """The running processes of one setup; ``stop`` ends each by its PID."""

    spec: StackSpec
    setup: Setup
    log_dir: Path
    cluster: Cluster | None = None
    hosted: Service | None = None
    gateway: Service | None = None
    url: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)

    def start(self) -> None:
        """Simulators first (in parallel), then the gateway once they answer; waits until it sees them all."""
        ts = self.spec.time_scale
        hosted_url = None
        if self.setup.hosted:
            port = free_port()
            argv = [
                sys.executable, "-m", "spillgate.gateway.cli", "sim-hosted", "--port", str(port),
                "--model-name", HOSTED_MODEL,
                "--ttft-ms", f"{HOSTED_TTFT_MS:g}", "--tpot-ms", f"{HOSTED_TPOT_MS:g}", "--time-scale", f"{ts:g}",
            ]  # fmt: skip
            self.hosted = start(f"{self._slug}-hosted", argv, self.log_dir)
            hosted_url = f"http://127.0.0.1:{port}"
        if self.setup.replicas:
            self.cluster = Cluster(ts, self.log_dir)
            self.cluster.start(
                self.spec.replicas, ["--max-running-requests", str(self.spec.max_running)], name=f"{self._slug}-replica"
            )
        if self.hosted is not None:
            wait_until(self.hosted, lambda: http_request(f"{hosted_url}/health")[0] == 200, timeout=60, what="/health")
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.config = gateway_config(self.spec, self.setup, port, self.cluster.urls if self.cluster else [], hosted_url)
        path = self.log_dir / f"{self._slug}-gateway.yaml"
        path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.argv = [sys.executable, "-m", "spillgate.gateway.cli", "serve", "--config", str(path), "--port", str(port)]
        self.gateway = start(f"{self._slug}-gateway", self.argv, self.log_dir)
        expected = (self.spec.replicas if self.setup.replicas else 0) + int(self.setup.hosted)

        def all_healthy() -> bool:
            status, body = http_request(self.url + "/health")
            if status != 200:
                return False
            backends = json.loads(body).get("backends", {})
            return sum(1 for b in backends.values() if b.get("healthy")) >= expected

        wait_until(self.gateway, all_healthy, timeout=90, what=f"/health with {expected} healthy backends")
        time.sleep(1.0)  # two scrapes at interval_s 0.5: server info (max_running_requests) and metrics are in

    @property
    def _slug(self) -> str:
        return self.setup.name.replace(" ", "-")

    @property
    def services(self) -> list[Service]:
        out = list(self.cluster.services) if self.cluster else []
        return out + [s for s in (self.hosted, self.gateway) if s is not None]

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds so far of each process: the gateway, the hosted simulator and the replicas together."""
        out = {"gateway": process_cpu_s(self.gateway.pid) if self.gateway else 0.0}
        out["hosted sim"] = process_cpu_s(self.hosted.pid) if self.hosted else 0.0
        out["replica sims"] = sum(process_cpu_s(s.pid) for s in self.cluster.services) if self.cluster else 0.0
        return out

    def health(self) -> dict[str, Any]:
        status, body = http_request(self.url + "/health")
        return json.loads(body) if status == 200 else {}

    def metrics(self) -> GatewayCounters:
        status, body = http_request(self.url + "/metrics")
        if status != 200:
            raise RuntimeError(f"{self.url}/metrics answered {status}")
        return GatewayCounters.parse(body.decode())

    def stop(self) -> None:
        for service in (self.gateway, self.hosted):
            if service is not None:
                service.stop()
        if self.cluster is not None:
            self.cluster.stop()


@dataclass
class GatewayCounters:
    """The gateway's cost and routing counters (``/metrics``); a run's figures are the differences."""

    spend_usd: dict[str, float] = field(default_factory=dict)
    """By backend kind: ``replica`` (GPU time per output token) and ``hosted`` (provider prices)."""
    hosted_equivalent_usd: float = 0.0
    requests: dict[tuple[str, str, str], float] = field(default_factory=dict)
    """By (backend, outcome, reason)."""

    @classmethod
    def parse(cls, text: str) -> GatewayCounters:
        out = cls()
        spend: dict[str, float] = defaultdict(float)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "spillgate_spend_usd_total":
                    spend[sample.labels.get("kind", "?")] += sample.value
                elif sample.name == "spillgate_hosted_equivalent_usd_total":
                    out.hosted_equivalent_usd += sample.value
                elif sample.name == "spillgate_requests_total":
                    key = (sample.labels.get("backend", ""), sample.labels.get("outcome", ""), sample.labels["reason"])
                    out.requests[key] = out.requests.get(key, 0.0) + sample.value
        out.spend_usd = dict(spend)
        return out

    def minus(self, earlier: GatewayCounters) -> GatewayCounters:
        kinds = set(self.spend_usd) | set(earlier.spend_usd)
        keys = set(self.requests) | set(earlier.requests)
        return GatewayCounters(
            spend_usd={k: self.spend_usd.get(k, 0.0) - earlier.spend_usd.get(k, 0.0) for k in kinds},
            hosted_equivalent_usd=self.hosted_equivalent_usd - earlier.hosted_equivalent_usd,
            requests={k: self.requests.get(k, 0.0) - earlier.requests.get(k, 0.0) for k in keys},
        )

    @property
    def total_usd(self) -> float:
        return sum(self.spend_usd.values())

    def by_reason(self) -> dict[str, int]:
        """Requests per ``x-spillgate-reason`` over every backend and outcome, most first."""
        counts: dict[str, float] = defaultdict(float)
        for (_, _, reason), value in self.requests.items():
            counts[reason] += value
        return {k: int(v) for k, v in sorted(counts.items(), key=lambda kv: -kv[1]) if v}
