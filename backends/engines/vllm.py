"""vLLM's OpenAI server (``vllm serve``, ``python -m vllm.entrypoints.openai.api_server``), as in 0.32.

- ``/health`` answers at once from the API server (503 once the engine core is dead): it is the liveness check.
- ``/v1/models`` lists ``max_model_len``; ``/metrics`` is always served, its gauges written every engine step:
  ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` (0-1), token
  counters ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` and ``vllm:prompt_tokens``, and
  ``vllm:cache_config_info`` whose labels hold the KV cache's ``num_gpu_blocks`` and ``block_size``.
- ``usage.prompt_tokens_details.cached_tokens`` (whole blocks only) only with ``--enable-prompt-tokens-details``;
  nothing at start-up says whether it is on, so the first response tells.
- Errors are OpenAI's ``{"error": {"message", "type", "param", "code"}}``.
- The running-request limit in force (``--max-num-seqs``, or the default vLLM chose for the device) is published
  only by the development endpoint ``/server_info?config_format=json`` (``VLLM_SERVER_DEV_MODE=1``, whose other
  endpoints reset caches and put the engine to sleep: not for production), as ``vllm_config.scheduler_config``;
  it applies per data-parallel rank. Without it (404, the default) the limit stays unknown.
"""

from __future__ import annotations

from typing import Any, ClassVar

import httpx

from spillgate.backends.engines.base import (
    Engine,
    Get,
    KvEventSource,
    ReplicaInfo,
    ReplicaLoad,
    as_int,
    model_context_window,
    register_engine,
)
from spillgate.backends.engines.prometheus import labels_of, read_figures

_SUMMED = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "queued"}
_PEAK = {"vllm:kv_cache_usage_perc": "token_usage"}
_COUNTERS = {
    "vllm:prompt_tokens_total": "prompt_tokens_total",
    "vllm:prefix_cache_queries_total": "queries",
    "vllm:prefix_cache_hits_total": "hits",
}


class VLLM(Engine):
    name: ClassVar[str] = "vllm"
    liveness_path: ClassVar[str] = "/health"
    owned_fields: ClassVar[tuple[str, ...]] = ("request_id", "priority", "kv_transfer_params", "data_parallel_rank")
    """Ids that could collide with other requests', queue jumping, and fields that would move KV cache to or
    from another host (disaggregated serving)."""
    cache_report_flag: ClassVar[str | None] = "--enable-prompt-tokens-details"
    dp_rank_header: ClassVar[bytes | None] = b"x-data-parallel-rank"
    """vLLM reads the rank from this header only (``X-data-parallel-rank``, ``entrypoints/generate/base``)."""

    def parse_load(self, text: str) -> ReplicaLoad:
        values = read_figures(text, summed=_SUMMED, peak=_PEAK, counters=_COUNTERS)
        queries = values.get("queries", 0.0)
        return ReplicaLoad(
            running=int(values.get("running", 0)),
            queued=int(values.get("queued", 0)),
            token_usage=values.get("token_usage", 0.0),
            # Over the process's life, not the last batch's as SGLang's gauge: vLLM publishes only the counters.
            cache_hit_rate=values.get("hits", 0.0) / queries if queries else 0.0,
            prompt_tokens_total=values.get("prompt_tokens_total", 0.0),
        )

    async def describe(self, get: Get, served_model: str) -> ReplicaInfo:
        context = await model_context_window(get, served_model)
        response = await get("/metrics")
        capacity = 0
        if response.status_code == 200:
            cache = labels_of(response.text, "vllm:cache_config_info")
            capacity = as_int(cache.get("num_gpu_blocks")) * as_int(cache.get("block_size"))
        version = await get("/version")
        sources = await get("/kv_event_sources")
        return ReplicaInfo(
            max_total_tokens=capacity,
            max_running=await _max_running(get),
            context_window=context,
            metrics=response.status_code == 200,
            version=str(version.json().get("version", "")) if version.status_code == 200 else "",
            kv_events=_kv_events(sources.json()) if sources.status_code == 200 else None,
            missing=() if response.status_code == 200 else ("load and restart signals: /metrics is not served",),
        )


register_engine(VLLM())


async def _max_running(get: Get) -> int:
    """The running-request limit over the data-parallel ranks this API server fronts, from the development-mode
    ``/server_info``; 0 when it is not served. Its first answer gathers the host's environment (cached after), so a
    timeout there leaves the limit unknown rather than failing the replica's probe."""
    try:
        response = await get("/server_info?config_format=json")
    except httpx.TimeoutException:
        return 0
    if response.status_code != 200:
        return 0
    body = response.json()
    config = body.get("vllm_config") if isinstance(body, dict) else None
    if not isinstance(config, dict):
        return 0  # the text format, or not vLLM's shape
    scheduler, parallel = config.get("scheduler_config"), config.get("parallel_config")
    per_rank = as_int(scheduler.get("max_num_seqs")) if isinstance(scheduler, dict) else 0
    return per_rank * _ranks_served(parallel if isinstance(parallel, dict) else {})


def _ranks_served(parallel: dict[str, Any]) -> int:
    """Engines behind one API server: all ranks with vLLM's internal load balancing, the node's own with the hybrid
    one, one with an external load balancer (each rank its own server)."""
    if parallel.get("data_parallel_external_lb"):
        return 1
    if parallel.get("data_parallel_hybrid_lb"):
        return max(1, as_int(parallel.get("data_parallel_size_local")))
    return max(1, as_int(parallel.get("data_parallel_size")))


def _kv_events(body: object) -> KvEventSource | None:
    """``/kv_event_sources``: ``{rank: its --kv-events-config}``, each rank's endpoints already offset by its rank.
    The first rank's publisher (rank 0's; a server behind an external load balancer lists only its own rank), and
    as many ranks as follow it on the ports after (the rule both engines place them by; a rank elsewhere, and those
    after it, are not followed). Only a publisher that binds (``tcp://*:PORT``) can be reached: one given an
    explicit host connects out to a subscriber there instead."""
    if not isinstance(body, dict):
        return None
    listed = sorted(int(key) for key in body if isinstance(key, str) and key.isdigit())
    source = _rank_source(body.get(str(listed[0]))) if listed else None
    if source is None:
        return None
    ranks = 1
    while _rank_source(body.get(str(listed[0] + ranks))) == source.rank(ranks):
        ranks += 1
    return KvEventSource(source.endpoint, source.replay_endpoint, source.topic, ranks=ranks)


def _rank_source(config: object) -> KvEventSource | None:
    if not isinstance(config, dict) or not config.get("enable_kv_cache_events") or config.get("publisher") != "zmq":
        return None
    endpoint, replay, topic = config.get("endpoint"), config.get("replay_endpoint"), config.get("topic")
    if not isinstance(endpoint, str) or not endpoint.startswith("tcp://*:"):
        return None
    return KvEventSource(
        endpoint=endpoint,
        replay_endpoint=replay if isinstance(replay, str) and replay else None,
        topic=topic if isinstance(topic, str) else "",
    )
