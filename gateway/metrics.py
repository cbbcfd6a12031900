"""The gateway's own Prometheus metrics, in a registry owned by the app rather than a module global."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)


class GatewayMetrics:
    def __init__(self) -> None:
        # ``*_created`` series double the page size and no dashboard reads them.
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "spillgate_requests",
            "Requests finished, by route, backend, outcome and routing reason.",
            ("route", "backend", "outcome", "reason"),
            registry=self.registry,
        )
        self.ttft = Histogram(
            "spillgate_ttft_seconds",
            "Time to first token as the client sees it.",
            ("backend",),
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tpot = Histogram(
            "spillgate_tpot_seconds",
            "Time per output token after the first.",
            ("backend",),
            buckets=_TPOT_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "spillgate_e2e_seconds",
            "End-to-end request latency.",
            ("backend",),
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "spillgate_prompt_tokens",
            "Prompt tokens by backend: all (kind=prompt), found in the replica's prefix cache (kind=cached), "
            "and what the prefix index predicted would be (kind=predicted_cached).",
            ("backend", "kind"),
            registry=self.registry,
        )
        self.spend = Counter(
            "spillgate_spend_usd",
            "What requests cost: hosted at the provider's prices, replicas as GPU time over their throughput.",
            ("route", "backend", "kind"),
            registry=self.registry,
        )
        self.hosted_equivalent = Counter(
            "spillgate_hosted_equivalent_usd",
            "What the same requests would have cost on the route's hosted model: the baseline for savings.",
            ("route",),
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "spillgate_backend_in_flight",
            "Requests the gateway has in flight per backend.",
            ("backend",),
            registry=self.registry,
        )
        self.backend_healthy = Gauge(
            "spillgate_backend_healthy",
            "1 when the backend passes its health checks.",
            ("backend",),
            registry=self.registry,
        )
