"""Reading an SGLang replica's load from its Prometheus ``/metrics`` page."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """The scheduler figures SGLang exports, summed over data-parallel ranks."""

    running: int = 0
    queued: int = 0
    token_usage: float = 0.0
    cache_hit_rate: float = 0.0
    prompt_tokens_total: float = 0.0
    """A counter that only grows while the process lives: when it goes down, the replica restarted."""


_SUMMED = {"sglang:num_running_reqs": "running", "sglang:num_queue_reqs": "queued"}
_PEAK = {"sglang:token_usage": "token_usage", "sglang:cache_hit_rate": "cache_hit_rate"}
_COUNTERS = {"sglang:prompt_tokens_total": "prompt_tokens_total"}


def parse_replica_load(text: str) -> ReplicaLoad:
    """Extract :class:`ReplicaLoad` from exposition text; absent metrics read as zero."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in _SUMMED:
            values[_SUMMED[family.name]] = sum(sample.value for sample in family.samples)
        elif family.name in _PEAK:
            values[_PEAK[family.name]] = max((sample.value for sample in family.samples), default=0.0)
        else:
            # A counter's family drops the ``_total`` suffix; its samples keep it (and add ``_created``).
            for sample in family.samples:
                if sample.name in _COUNTERS:
                    key = _COUNTERS[sample.name]
                    values[key] = values.get(key, 0.0) + sample.value
    return ReplicaLoad(
        running=int(values.get("running", 0)),
        queued=int(values.get("queued", 0)),
        token_usage=values.get("token_usage", 0.0),
        cache_hit_rate=values.get("cache_hit_rate", 0.0),
        prompt_tokens_total=values.get("prompt_tokens_total", 0.0),
    )
