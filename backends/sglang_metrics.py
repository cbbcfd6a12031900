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


_SUMMED = {"sglang:num_running_reqs": "running", "sglang:num_queue_reqs": "queued"}
_PEAK = {"sglang:token_usage": "token_usage", "sglang:cache_hit_rate": "cache_hit_rate"}


def parse_replica_load(text: str) -> ReplicaLoad:
    """Extract :class:`ReplicaLoad` from exposition text; absent metrics read as zero."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in _SUMMED:
            values[_SUMMED[family.name]] = sum(sample.value for sample in family.samples)
        elif family.name in _PEAK:
            values[_PEAK[family.name]] = max((sample.value for sample in family.samples), default=0.0)
    return ReplicaLoad(
        running=int(values.get("running", 0)),
        queued=int(values.get("queued", 0)),
        token_usage=values.get("token_usage", 0.0),
        cache_hit_rate=values.get("cache_hit_rate", 0.0),
    )
