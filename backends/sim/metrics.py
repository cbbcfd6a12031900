"""Prometheus metrics under SGLang's names, labels and buckets (one registry per app).

Scheduler gauges are read from the scheduler when /metrics is scraped; request counters and
histograms are observed when requests finish, in simulated seconds.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from spillgate.backends.sim.request import SimRequest
from spillgate.backends.sim.scheduler import SchedulerStats

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
    0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip
TOKEN_BUCKETS = (
    100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500, 15000,
    17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000, 300000,
    400000, 600000, 800000, 1000000, 1100000,
)  # fmt: skip

_SCHEDULER_GAUGES: tuple[tuple[str, str, Callable[[SchedulerStats], float]], ...] = (
    ("num_running_reqs", "The number of running requests.", lambda s: s.num_running_reqs),
    ("num_queue_reqs", "The number of requests in the waiting queue.", lambda s: s.num_queue_reqs),
    ("num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.", lambda s: 0),
    ("gen_throughput", "The generation throughput (token/s).", lambda s: s.gen_throughput),
    ("cache_hit_rate", "The prefix cache hit rate.", lambda s: s.cache_hit_rate),
    ("decode_sum_seq_lens", "The sum of all sequence lengths in decode.", lambda s: s.decode_sum_seq_lens),
    ("token_usage", "The token usage.", lambda s: s.token_usage),
    ("full_token_usage", "The token usage for full attention layers.", lambda s: s.token_usage),
    ("num_used_tokens", "The number of used tokens.", lambda s: s.num_used_tokens),
    ("kv_available_tokens", "Number of free token slots in the KV cache pool.", lambda s: s.kv_available_tokens),
    (
        "kv_evictable_tokens",
        "Number of evictable (radix-cached) token slots in the KV cache pool.",
        lambda s: s.kv_evictable_tokens,
    ),
    ("kv_used_tokens", "Number of actively used token slots in the KV cache pool.", lambda s: s.num_used_tokens),
    ("num_retracted_reqs", "The number of retracted requests.", lambda s: s.num_retracted_reqs),
    ("num_paused_reqs", "The number of paused requests by async weight sync.", lambda s: 0),
)


_PER_PROCESS = ("num_retracted_reqs", "num_paused_reqs")


class _SchedulerCollector(Collector):
    """Reports the scheduler gauges fresh on every scrape."""

    def __init__(self, stats: Callable[[], SchedulerStats], labels: dict[str, str], static: dict[str, float]) -> None:
        self._stats = stats
        self._labels = labels
        self._static = static

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stats = self._stats()
        names, values = list(self._labels), list(self._labels.values())
        for name, doc, read in _SCHEDULER_GAUGES:
            # SGLang's multiprocess mode "all" for these two adds the writing process's pid.
            per_process = name in _PER_PROCESS
            family = GaugeMetricFamily(f"sglang:{name}", doc, labels=[*names, "pid"] if per_process else names)
            family.add_metric([*values, str(os.getpid())] if per_process else values, float(read(stats)))
            yield family
        for name, value in self._static.items():
            family = GaugeMetricFamily(f"sglang:{name}", f"The {name.replace('_', ' ')}.", labels=names)
            family.add_metric(values, value)
            yield family


class ReplicaMetrics:
    """The /metrics registry of one simulated replica."""

    def __init__(
        self,
        *,
        model_name: str,
        stats: Callable[[], SchedulerStats],
        static_gauges: dict[str, float],
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._labels = {"model_name": model_name, "engine_type": "unified"}
        scheduler_labels = {**self._labels, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        self.registry.register(_SchedulerCollector(stats, scheduler_labels, static_gauges))

        base = list(self._labels)
        streaming = [*base, "is_streaming"]
        reg = self.registry
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens_total", "Number of prefill tokens processed.", streaming, registry=reg
        )
        self.generation_tokens = Counter(
            "sglang:generation_tokens_total", "Number of generation tokens processed.", streaming, registry=reg
        )
        self.cached_tokens = Counter(
            "sglang:cached_tokens_total",
            "Number of cached prompt tokens by source (device/host/storage).",
            [*base, "cache_source"],
            registry=reg,
        )
        self.num_requests = Counter(
            "sglang:num_requests_total", "Number of requests processed.", streaming, registry=reg
        )
        self.num_aborted = Counter(
            "sglang:num_aborted_requests_total", "Number of requests aborted.", base, registry=reg
        )
        self.prompt_tokens_histogram = Histogram(
            "sglang:prompt_tokens_histogram",
            "Histogram of prompt token length.",
            base,
            buckets=TOKEN_BUCKETS,
            registry=reg,
        )
        self.generation_tokens_histogram = Histogram(
            "sglang:generation_tokens_histogram",
            "Histogram of generation token length.",
            base,
            buckets=TOKEN_BUCKETS,
            registry=reg,
        )
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            streaming,
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            base,
            buckets=ITL_BUCKETS,
            registry=reg,
        )
        self.tpot = Histogram(
            "sglang:request_time_per_output_token_seconds",
            "Per-request TPOT in seconds: (finished_time - first_token_time) / (completion_tokens - 1).",
            streaming,
            buckets=ITL_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            streaming,
            buckets=E2E_BUCKETS,
            registry=reg,
        )

        self._itl_child = self.itl.labels(**self._labels)

    def _streaming(self, is_streaming: bool) -> dict[str, str]:
        return {**self._labels, "is_streaming": "true" if is_streaming else "false"}

    def observe_first_token(self, req: SimRequest, *, is_streaming: bool) -> None:
        assert req.first_token_at is not None
        self.ttft.labels(**self._streaming(is_streaming)).observe(req.first_token_at - req.arrival)

    def observe_inter_token(self, interval: float, num_new_tokens: int) -> None:
        """SGLang spreads an output batch's interval evenly over the tokens it carried."""
        if num_new_tokens > 0:
            per_token = interval / num_new_tokens
            for _ in range(num_new_tokens):
                self._itl_child.observe(per_token)

    def observe_aborted(self) -> None:
        self.num_aborted.labels(**self._labels).inc()

    def observe_finished(self, req: SimRequest, *, is_streaming: bool) -> None:
        if req.finish_reason is not None and req.finish_reason.get("type") == "abort":
            return  # counted by observe_aborted when the caller gave up on it
        labels = self._streaming(is_streaming)
        prompt, output = len(req.input_ids), len(req.output_ids)
        self.prompt_tokens.labels(**labels).inc(prompt)
        self.generation_tokens.labels(**labels).inc(output)
        if req.cached_tokens:
            self.cached_tokens.labels(**self._labels, cache_source="device").inc(req.cached_tokens)
        self.num_requests.labels(**labels).inc()
        self.prompt_tokens_histogram.labels(**self._labels).observe(prompt)
        self.generation_tokens_histogram.labels(**self._labels).observe(output)
        if req.finished_at is not None:
            self.e2e.labels(**labels).observe(req.finished_at - req.arrival)
            if req.first_token_at is not None and output > 1:
                self.tpot.labels(**labels).observe((req.finished_at - req.first_token_at) / (output - 1))

    def render(self) -> bytes:
        return as_multiprocess(generate_latest(self.registry).decode()).encode()


def as_multiprocess(text: str) -> str:
    """The page as SGLang's multiprocess collector writes it: counters named with their ``_total`` in HELP and
    TYPE, and no ``_created`` samples (its files keep no creation times)."""
    counters = {
        line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ") and line.endswith(" counter")
    }
    out = []
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            kind, name, rest = line[:7], line.split()[2], line.split(" ", 3)[3]
            if name.endswith("_created"):
                continue
            out.append(f"{kind}{name}_total {rest}" if name in counters else line)
        elif line.split("{", 1)[0].split(" ", 1)[0].endswith("_created"):
            continue
        else:
            out.append(line)
    return "\n".join(out) + "\n"
