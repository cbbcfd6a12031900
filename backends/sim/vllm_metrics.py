"""Prometheus metrics of the simulator's vLLM face, under vLLM 0.32's names and labels (``v1/metrics/loggers.py``).

Gauges are read from the scheduler at each scrape (vLLM writes them every engine step); token counters and
latency histograms are observed as requests end, in simulated seconds. ``vllm:cache_config_info`` carries the
KV cache's size in its labels, as vLLM's does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from spillgate.backends.sim.metrics import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS
from spillgate.backends.sim.request import SimRequest
from spillgate.backends.sim.scheduler import SchedulerStats

LABELS = ("model_name", "engine")
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
"""The ``finished_reason`` values vLLM counts successes under, each shown from start."""
_CACHE_CONFIG = {
    "_block_size_resolved": "True",
    "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.9",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_cache_max_concurrency": "None",
    "kv_cache_memory_bytes": "None",
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "auto",
    "num_cpu_blocks": "None",
    "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
}
"""vLLM 0.32's ``CacheConfig.metrics_info()`` labels, as a GPU server without overrides shows them."""


class _EngineGauges(Collector):
    def __init__(self, stats: Callable[[], SchedulerStats], values: list[str], cache_info: dict[str, str]) -> None:
        self._stats = stats
        self._values = values
        self._cache_info = cache_info

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stats = self._stats()
        for name, doc, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", stats.num_running_reqs),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", stats.num_queue_reqs),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", stats.token_usage),
        ):
            family = GaugeMetricFamily(name, doc, labels=LABELS)
            family.add_metric(self._values, float(value))
            yield family
        info = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=[*self._cache_info, "engine"]
        )
        info.add_metric([*self._cache_info.values(), "0"], 1.0)
        yield info


class VllmMetrics:
    """The /metrics registry of one simulated vLLM replica; same observer methods as the SGLang face's."""

    def __init__(
        self, *, model_name: str, stats: Callable[[], SchedulerStats], block_size: int, num_blocks: int
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        values = [model_name, "0"]
        cache_info = {
            **_CACHE_CONFIG,
            "block_size": str(block_size),
            "effective_attention_block_size": str(block_size),
            "num_gpu_blocks": str(num_blocks),
            "kv_cache_size_tokens": str(block_size * num_blocks),
        }
        self.registry.register(_EngineGauges(stats, values, cache_info))

        # vLLM creates each labelled child at start, so an idle replica already shows its counters at 0.
        def counter(name: str, doc: str) -> Counter:
            metric = Counter(name, doc, LABELS, registry=self.registry)
            metric.labels(*values)
            return metric

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            metric = Histogram(name, doc, LABELS, buckets=buckets, registry=self.registry)
            metric.labels(*values)
            return metric

        self._queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self._hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self._prompt = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self._cached = counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).")
        self._generation = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self._success = Counter(
            "vllm:request_success", "Count of successfully processed requests.", [*LABELS, "finished_reason"],
            registry=self.registry,
        )  # fmt: skip
        for reason in FINISHED_REASONS:
            self._success.labels(*values, reason)
        self._ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                               TTFT_BUCKETS)  # fmt: skip
        self._itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                              ITL_BUCKETS)  # fmt: skip
        self._e2e = histogram("vllm:e2e_request_latency_seconds",
                              "Histogram of e2e request latency in seconds.", E2E_BUCKETS)  # fmt: skip
        self._values = values

    def observe_first_token(self, req: SimRequest, *, is_streaming: bool) -> None:
        if req.first_token_at is not None:
            self._ttft.labels(*self._values).observe(req.first_token_at - req.arrival)

    def observe_inter_token(self, interval: float, num_new_tokens: int) -> None:
        if num_new_tokens > 0 and interval > 0:
            child = self._itl.labels(*self._values)
            for _ in range(num_new_tokens):
                child.observe(interval / num_new_tokens)

    def observe_aborted(self) -> None:
        self._success.labels(*self._values, "abort").inc()

    def observe_finished(self, req: SimRequest, *, is_streaming: bool) -> None:
        prompt, cached = len(req.input_ids), req.cached_tokens
        self._queries.labels(*self._values).inc(prompt)
        self._hits.labels(*self._values).inc(cached)
        self._prompt.labels(*self._values).inc(prompt)
        self._cached.labels(*self._values).inc(cached)
        self._generation.labels(*self._values).inc(len(req.output_ids))
        reason = "length" if req.finish_reason and req.finish_reason.get("type") == "length" else "stop"
        self._success.labels(*self._values, reason).inc()
        if req.finished_at is not None:
            self._e2e.labels(*self._values).observe(req.finished_at - req.arrival)

    def render(self) -> bytes:
        return generate_latest(self.registry)
