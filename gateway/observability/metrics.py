"""The gateway's own Prometheus metrics, in a registry owned by the app rather than a module global."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)
_RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0)


ALL_TENANTS = "all"
"""The tenant label's value when the deployment has not enabled per-tenant labels."""


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
        self.ttft_prediction = Histogram(
            "spillgate_ttft_prediction_ratio",
            "A streamed request's TTFT over the TTFT predicted for the replica it was sent to (1 is exact, above 1 "
            "slower than predicted): how far routing, spill and SLO decisions can trust their predictions.",
            ("backend",),
            buckets=_RATIO_BUCKETS,
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
        self.prefill_waits = Counter(
            "spillgate_prefill_waits",
            "Requests held until the prefill of their prefix by another request on the backend had started, so "
            "that they found the prefix cached rather than computing it again.",
            ("backend",),
            registry=self.registry,
        )
        self.prompt_holds = Counter(
            "spillgate_prompt_holds",
            "Streamed prompts held at the gateway because their replica already had pools[].max_waiting_prefill_tokens "
            "(an eighth of a prefill batch by default) waiting unscheduled, so as not to lengthen the next batch.",
            ("backend",),
            registry=self.registry,
        )
        self.refusals = Counter(
            "spillgate_refusals",
            "Error answers the gateway wrote itself, by status and error code (empty when the answer has none): every "
            "refusal (401, 403, 404, 413, 422, 429, 503, ...) on every endpoint, and its own 502/504 when no backend "
            "could answer. A backend's own verdict on a request (its 4xx), passed on, is not counted. tenant is the "
            "key's tenant with metrics.tenant_labels (empty when the key was not known), else all.",
            ("status", "code", "tenant"),
            registry=self.registry,
        )
        self.output_tokens = Counter(
            "spillgate_output_tokens",
            "Output tokens, as each backend reported them in the answer's usage (completion_tokens), by backend and "
            "route.",
            ("backend", "route"),
            registry=self.registry,
        )
        self.overloaded = Counter(
            "spillgate_overloaded",
            "Completions refused with 503 because limits.max_in_flight requests were already in flight.",
            registry=self.registry,
        )
        self.ejections = Counter(
            "spillgate_backend_ejections",
            "Replicas taken out of rotation by passive outlier detection: outlier.consecutive_failures failed "
            "requests in a row, or a failed trial after an ejection (backends.outlier).",
            ("backend",),
            registry=self.registry,
        )
        self.fallbacks_refused = Counter(
            "spillgate_fallbacks_refused",
            "Requests that failed before the client saw a byte and were not sent to another backend because the "
            "retry budget (outlier.retry_budget_*) was spent.",
            registry=self.registry,
        )
        self.spend = Counter(
            "spillgate_spend_usd",
            "What requests cost: hosted at the provider's prices, replicas as GPU time over their throughput; "
            "reason: why the backend was chosen (complex: the complexity score sent it to the top tier).",
            ("tenant", "route", "backend", "kind", "reason"),
            registry=self.registry,
        )
        self.hosted_equivalent = Counter(
            "spillgate_hosted_equivalent_usd",
            "What the same requests would have cost on the route's hosted model (on routes without one: what they "
            "cost): the baseline for savings, which are this minus spillgate_spend_usd.",
            ("tenant", "route"),
            registry=self.registry,
        )
        self.slo = Counter(
            "spillgate_slo_requests",
            "Finished requests by the tenant's SLO class and whether they met its TTFT and TPOT targets "
            "(result=met, ttft_missed, tpot_missed); goodput is the rate of result=met.",
            ("slo_class", "result"),
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
        self.degraded = Gauge(
            "spillgate_degraded",
            "1 while shared state in Redis is unreachable or behind: component=accounting (limits enforced per "
            "process, ledger entries waiting in the local file) or prefix_index (routing on the local index); "
            "component=ledger while the ledger file cannot be written (entries waiting in memory).",
            ("component",),
            registry=self.registry,
        )
        self.queued = Gauge(
            "spillgate_backend_queued_requests",
            "Requests waiting in the replica's queue, as last scraped from its /metrics.",
            ("backend",),
            registry=self.registry,
        )
        self.running = Gauge(
            "spillgate_backend_running_requests",
            "Requests in the replica's running batch, as last scraped.",
            ("backend",),
            registry=self.registry,
        )
        self.kv_usage = Gauge(
            "spillgate_backend_kv_usage_ratio",
            "Fraction of the replica's KV cache in use, as last scraped.",
            ("backend",),
            registry=self.registry,
        )
        self.pool_rent = Gauge(
            "spillgate_pool_rent_usd",
            "What the pool's replicas have cost since this gateway process started, busy or idle (replicas x "
            "gpu_usd_per_hour x hours). Every process reports the whole rent: take max, not sum, over processes.",
            ("pool",),
            registry=self.registry,
        )
        self.pool_rented_seconds = Gauge(
            "spillgate_pool_rented_replica_seconds",
            "Replica-seconds rented since this process started: the denominator of utilization.",
            ("pool",),
            registry=self.registry,
        )
        self.pool_busy_seconds = Gauge(
            "spillgate_pool_busy_replica_seconds",
            "Replica-seconds this process's requests took (uncached prompt tokens at prefill_tokens_per_s plus "
            "output tokens at output_tokens_per_s): sum over processes, over rented seconds for utilization.",
            ("pool",),
            registry=self.registry,
        )
        self.recommended_replicas = Gauge(
            "spillgate_recommended_replicas",
            "Replicas the pool needs now (GET /capacity has the inputs): max(capacity.min_replicas, the peak arrival "
            "rate over the lookback with headroom over one replica's requests/s, current + 1 on sustained pressure).",
            ("pool",),
            registry=self.registry,
        )
        self.prefix_predictions = Gauge(
            "spillgate_prefix_predictions",
            "Answered requests since start whose predicted cached tokens (in whole prefix blocks) were exact, over or "
            "under what the replica reported, by what the prediction came from (events, events+belief, belief).",
            ("backend", "source", "outcome"),
            registry=self.registry,
        )
        self.kv_events_lag = Gauge(
            "spillgate_kv_events_lag_seconds",
            "Between a replica stamping its last KV-event batch and this process applying it.",
            ("backend",),
            registry=self.registry,
        )
        self.pool_replicas = Gauge(
            "spillgate_pool_replicas", "Replicas the pool has now, healthy or not.", ("pool",), registry=self.registry
        )
        self.capacity_peak_rps = Gauge(
            "spillgate_capacity_peak_rps",
            "The pool's demand (served plus spilled as overflow): its highest mean arrival rate over any "
            "capacity.rate_window_s within capacity.lookback_s, as this process saw it.",
            ("pool",),
            registry=self.registry,
        )
        self.capacity_output_tps = Gauge(
            "spillgate_capacity_replica_output_tps",
            "One replica's output tokens/s at the SLO that the advice uses: source=measured once a replica was seen "
            "saturated within the SLO, else source=configured (pools[].output_tokens_per_s).",
            ("pool", "source"),
            registry=self.registry,
        )
        self.capacity_pressure_seconds = Gauge(
            "spillgate_capacity_pressure_seconds",
            "How long the pool has queued requests or had its KV cache over capacity.kv_high without a break "
            "(0: not now); at capacity.sustain_s it asks for one more replica.",
            ("pool",),
            registry=self.registry,
        )
        self._backend_gauges = (
            self.in_flight,
            self.backend_healthy,
            self.queued,
            self.running,
            self.kv_usage,
            self.kv_events_lag,
            self.prefix_predictions,
        )

    def clear_backend_gauges(self) -> None:
        """Forget every backend's gauges, so that the next values set describe only the backends configured now."""
        for gauge in self._backend_gauges:
            gauge.clear()
