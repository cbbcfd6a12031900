"""SGLang (``python -m sglang.launch_server``), as its 0.5 servers behave with their default flags.

- ``/health`` runs a one-token generation and answers after at least a second, later under load, 503 after 20 s
  (``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION`` defaults on): too slow for liveness. ``/ready`` answers from
  the HTTP process at once; the generation check runs now and then in the background.
- ``/server_info`` (``/get_server_info`` before 0.5.10) carries the server args; ``max_running_requests`` is
  null unless set by flag, and the effective limit is each data-parallel rank's
  ``internal_states[].effective_max_running_requests_per_dp``.
- ``/metrics`` exists only with ``--enable-metrics``; ``usage.prompt_tokens_details`` only with
  ``--enable-cache-report`` (then ``cached_tokens`` is present, 0 included).
- Errors are flat: ``{"object": "error", "message", "type", "param", "code"}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from spillgate.backends.engines.base import (
    Engine,
    Get,
    KvEventSource,
    ReplicaInfo,
    ReplicaLoad,
    as_int,
    model_context_window,
    openai_error_message,
    register_engine,
)
from spillgate.backends.engines.prometheus import read_figures

_SUMMED = {"sglang:num_running_reqs": "running", "sglang:num_queue_reqs": "queued"}
_PEAK = {"sglang:token_usage": "token_usage", "sglang:cache_hit_rate": "cache_hit_rate"}
_COUNTERS = {"sglang:prompt_tokens_total": "prompt_tokens_total"}


class SGLang(Engine):
    name: ClassVar[str] = "sglang"
    liveness_path: ClassVar[str] = "/ready"
    generation_check: ClassVar[tuple[str, float] | None] = ("/health", 25.0)
    """SGLang gives up on its own check after ``SGLANG_HEALTH_CHECK_TIMEOUT`` (20 s) and answers 503."""
    owned_fields: ClassVar[tuple[str, ...]] = (
        "rid",
        "bootstrap_host",
        "bootstrap_port",
        "bootstrap_room",
        "lora_path",
        "custom_logit_processor",
        "data_parallel_rank",
        "routed_dp_rank",
        "disagg_prefill_dp_rank",
        "priority",
        "return_hidden_states",
    )
    """They would name another host (disaggregation bootstrap), load files or code on the replica, pick its
    data-parallel rank (the gateway does, by the ranks' caches), jump the queue, or collide with other requests'
    ids."""
    cache_report_flag: ClassVar[str | None] = "--enable-cache-report"
    dp_rank_field: ClassVar[str | None] = "data_parallel_rank"
    """Taken by every SGLang that routes by rank (``routed_dp_rank`` since 0.5.2x, where this name still works)."""

    def parse_load(self, text: str) -> ReplicaLoad:
        values = read_figures(text, summed=_SUMMED, peak=_PEAK, counters=_COUNTERS)
        return ReplicaLoad(
            running=int(values.get("running", 0)),
            queued=int(values.get("queued", 0)),
            token_usage=values.get("token_usage", 0.0),
            cache_hit_rate=values.get("cache_hit_rate", 0.0),
            prompt_tokens_total=values.get("prompt_tokens_total", 0.0),
        )

    async def describe(self, get: Get, served_model: str) -> ReplicaInfo:
        response = await get("/server_info")
        if response.status_code == 404:
            response = await get("/get_server_info")
        response.raise_for_status()
        info = response.json()
        if not isinstance(info, dict):
            raise ValueError("server info is not an object")
        metrics = bool(info.get("enable_metrics"))
        cache_report = bool(info.get("enable_cache_report"))
        missing = []
        if not metrics:
            missing.append("load and restart signals: start SGLang with --enable-metrics")
        if not cache_report:
            missing.append("cached-token feedback to the prefix index: start SGLang with --enable-cache-report")
        context = await model_context_window(get, served_model)
        return ReplicaInfo(
            max_total_tokens=as_int(info.get("max_total_num_tokens")),
            max_running=effective_max_running(info),
            prefill_batch_tokens=max(0, as_int(info.get("chunked_prefill_size"))),
            context_window=context,
            overlap_schedule=not info.get("disable_overlap_schedule", False),
            metrics=metrics,
            cache_report=cache_report,
            version=str(info.get("version") or ""),
            kv_events=_kv_events(info.get("kv_events"), info.get("dp_size")),
            missing=tuple(missing),
        )

    def error_message(self, body: object) -> tuple[str, str | None] | None:
        if isinstance(body, dict) and body.get("object") == "error":
            message, param = body.get("message"), body.get("param")
            if isinstance(message, str) and message:
                # A validation error carries the server's traceback, file paths and all: not the client's to see.
                message = message.split("\n\n  File ", 1)[0].strip()
                return message, param if isinstance(param, str) else None
        return openai_error_message(body)

    def template_messages(self, payload: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
        return final_assistant_as_user(payload)


def final_assistant_as_user(payload: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    """SGLang renders a chat that ends with the assistant's text as if the user had said it, unless the request
    asks to continue that message (``serving_chat.py``, ``_handle_last_assistant_message``; a missing content is
    "" by then, so a final tool call becomes an empty user turn). Content parts are left as they are."""
    messages = payload["messages"]
    last = messages[-1] if messages else None
    if not isinstance(last, Mapping) or last.get("role") != "assistant" or payload.get("continue_final_message"):
        return messages
    content = last.get("content")
    if content is not None and not isinstance(content, str):
        return messages
    return [*messages[:-1], {"role": "user", "content": content or ""}]


def effective_max_running(info: dict[str, Any]) -> int:
    """The running-request limit SGLang applies: the flag's value when given, else what each data-parallel
    rank's scheduler chose from its KV capacity, summed over ranks."""
    explicit = as_int(info.get("max_running_requests"))
    if explicit:
        return explicit
    states = info.get("internal_states")
    if not isinstance(states, list):
        return 0
    return sum(as_int(s.get("effective_max_running_requests_per_dp")) for s in states if isinstance(s, dict))


register_engine(SGLang())


def _kv_events(block: object, dp_size: object) -> KvEventSource | None:
    """``/server_info``'s ``kv_events``: the publisher's host and base port, and how many data-parallel ranks
    publish (its ``dp_size``, else the server's): rank r on port + r, each with its own cache."""
    if not isinstance(block, dict) or block.get("publisher", "zmq") != "zmq":
        return None
    host, port = block.get("endpoint_host"), block.get("endpoint_port_base")
    if not isinstance(port, int) or port <= 0:
        return None
    host = host if isinstance(host, str) else ""
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    replay = block.get("replay_endpoint_port_base")
    topic = block.get("topic")
    ranks = as_int(block.get("dp_size")) or as_int(dp_size)
    return KvEventSource(
        endpoint=f"tcp://{host}:{port}",
        replay_endpoint=f"tcp://{host}:{replay}" if isinstance(replay, int) and replay > 0 else None,
        topic=topic if isinstance(topic, str) else "",
        ranks=max(1, ranks),
    )
