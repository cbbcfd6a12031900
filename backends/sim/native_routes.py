"""SGLang's native routes: health, server/model info, /generate, cache flush, load and metrics."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from spillgate.backends.sim import payloads
from spillgate.backends.sim.config import DEFAULT_MAX_NEW_TOKENS, SGLANG_VERSION
from spillgate.backends.sim.engine import GenerationParams, RequestHandle
from spillgate.backends.sim.errors import native_error_response
from spillgate.backends.sim.presets import GIB
from spillgate.backends.sim.protocol import GenerateRequest, SamplingParams
from spillgate.backends.sim.replica import Replica, ReplicaDep
from spillgate.backends.sim.tokenizer import BEGIN_OF_TEXT
from spillgate.backends.sim.wire import DONE, EventStreamResponse, OrjsonResponse, sse_event

HEALTH_CHECK_TIMEOUT_S = 20.0
FLUSH_OK = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)

router = APIRouter()


@router.get("/ready")
async def ready() -> Response:
    """Answered by the HTTP process at once: the server is up."""
    return Response(status_code=200)


@router.get("/health")
@router.get("/health_generate")
async def health_generate(replica: ReplicaDep) -> Response:
    """As SGLang's default ``/health``: send a one-token generation, then look once a (simulated) second whether
    the scheduler has answered anything since; 503 after 20 s of silence."""
    handle = replica.engine.submit([0], GenerationParams(max_new_tokens=1, exact_length=True, log_metrics=False))
    waited = 0.0
    try:
        while waited < HEALTH_CHECK_TIMEOUT_S:
            await replica.clock.sleep(1.0)
            waited += 1.0
            if handle.req.output_ids or replica.scheduler.stats().num_running_reqs:
                return Response(status_code=200)
        return Response(status_code=503)
    finally:
        handle.close()


def _model_info(replica: Replica) -> dict[str, Any]:
    config, model = replica.config, replica.config.preset_spec.model
    return {
        "model_path": config.model_path,
        "served_model_name": config.served_model_name,
        "tokenizer_path": config.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "load_format": "auto",
        "reasoning_parser": None,
        "tool_call_parser": config.tool_call_parser,
        "disaggregation_mode": "null",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": model.model_type,
        "architectures": [model.architecture],
    }


@router.get("/get_model_info")
@router.get("/model_info")
async def model_info(replica: ReplicaDep) -> OrjsonResponse:
    return OrjsonResponse(_model_info(replica))


def _memory_usage(replica: Replica) -> dict[str, Any]:
    config, preset = replica.config, replica.config.preset_spec
    return {
        "weight": round(preset.weight_bytes_per_gpu / GIB, 3),
        "kvcache": round(config.max_total_num_tokens * preset.kv_bytes_per_token_per_gpu / GIB, 3),
        "startup_available": round((preset.gpu.memory_bytes - preset.weight_bytes_per_gpu) / GIB, 3),
        "token_capacity": config.max_total_num_tokens,
        "token_capacity_swa": None,
        "graph": {},
    }


def _startup_time() -> dict[str, Any]:
    """Seconds each start-up phase took (0.5.23 reports phases, not one figure): a simulator starts at once."""
    graphs = dict.fromkeys(("decode", "draft_decode", "draft_extend", "draft_prefill", "prefill", "target_verify"), 0.0)
    phases = {"cuda_graph": graphs, "kv_cache_allocation": 0.0, "load_weight": 0.0, "scheduler_e2e": 0.0}
    return phases


@router.get("/get_server_info")
@router.get("/server_info")
async def server_info(replica: ReplicaDep) -> OrjsonResponse:
    config = replica.config
    server_args = config.server_args()
    startup_time = _startup_time()
    internal_state = {
        **server_args,
        "world_size": config.preset_spec.tp_size,
        "startup_time": startup_time,
        "effective_max_running_requests_per_dp": config.resolved_max_running_requests,
        "last_gen_throughput": replica.scheduler.stats().gen_throughput,
        "memory_usage": _memory_usage(replica),
    }
    return OrjsonResponse(
        {
            **server_args,
            "launch_command": f"python -m sglang.launch_server --model-path {config.model_path}",
            "status": "ready",
            "max_total_num_tokens": config.max_total_num_tokens,
            "max_req_input_len": config.max_req_input_len,
            "kv_events": config.kv_events.server_info(config.page_size) if config.kv_events else None,
            "startup_time": {**startup_time, "tokenizer_e2e": 0.0},
            "internal_states": [internal_state] * config.dp_size,  # one per data-parallel rank
            "version": SGLANG_VERSION,
            "frontend": "python",
            "simulator": {"preset": config.preset, "time_scale": config.time_scale},
        }
    )


@router.api_route("/generate", methods=["POST", "PUT"])
async def generate(body: GenerateRequest, request: Request, replica: ReplicaDep) -> Response:
    if body.text is None and body.input_ids is None:
        return native_error_response("Either text, input_ids or input_embeds should be provided.")
    if body.text is not None and body.input_ids is not None:
        return native_error_response("Either text or input_ids should be provided.")
    if body.input_ids is not None:
        input_ids = list(body.input_ids)
    else:
        input_ids = [BEGIN_OF_TEXT, *replica.tokenizer.encode(body.text or "")]
    sampling = body.sampling_params or SamplingParams()
    explicit_limit = "max_new_tokens" in sampling.model_fields_set and sampling.max_new_tokens is not None
    params = GenerationParams(
        max_new_tokens=sampling.max_new_tokens if explicit_limit else DEFAULT_MAX_NEW_TOKENS,
        exact_length=explicit_limit or sampling.ignore_eos,
        rid=body.rid,
        cache_salt=body.cache_salt,
        extra_key=body.extra_key,
        priority=body.priority,
        stream=body.stream,
        log_metrics=body.log_metrics,
    )
    try:
        handle = replica.engine.submit(input_ids, params)
    except ValueError as exc:
        return native_error_response(str(exc))
    if body.stream:
        return EventStreamResponse(_generate_stream(replica, handle), on_close=handle.close)
    req = await handle.result(request.is_disconnected)
    return OrjsonResponse(
        {
            "text": replica.tokenizer.decode(req.output_ids),
            "output_ids": list(req.output_ids),
            "meta_info": payloads.meta_info(req, handle.received_unix),
        }
    )


async def _generate_stream(replica: Replica, handle: RequestHandle) -> AsyncIterator[bytes]:
    """Each chunk carries the whole text and output ids so far, as SGLang streams by default."""
    req = handle.req
    text = ""
    async for update in handle.updates():
        text += replica.tokenizer.decode(update.new_ids)
        yield sse_event(
            {
                "text": text,
                "output_ids": req.output_ids,
                "meta_info": payloads.meta_info(req, handle.received_unix),
            }
        )
    yield DONE


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(replica: ReplicaDep, timeout: Annotated[float, Query(ge=0.0)] = 0.0) -> Response:
    if await replica.scheduler.flush_cache(timeout):
        return Response(content=FLUSH_OK, status_code=200)
    return Response(content="Flush cache failed.\n", status_code=400)


def _load_snapshot(replica: Replica) -> dict[str, Any]:
    """One DP rank's LoadSnapshot, with the fields /v1/loads reports under "core"."""
    stats, config = replica.scheduler.stats(), replica.config
    num_total_tokens = stats.num_used_tokens + stats.num_waiting_uncached_tokens
    return {
        "timestamp": time.time(),
        "dp_rank": 0,
        "num_running_reqs": stats.num_running_reqs,
        "num_waiting_reqs": stats.num_queue_reqs,
        "num_waiting_uncached_tokens": stats.num_waiting_uncached_tokens,
        "num_used_tokens": stats.num_used_tokens,
        "num_total_tokens": num_total_tokens,
        "num_active_tokens": num_total_tokens,
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": config.max_total_num_tokens,
        "max_running_requests": config.resolved_max_running_requests,
        "token_usage": round(stats.token_usage, 4),
        "gen_throughput": round(stats.gen_throughput, 2),
        "cache_hit_rate": round(stats.cache_hit_rate, 4),
        "utilization": 1.0 if stats.num_running_reqs else 0.0,
    }


@router.get("/get_load")
async def get_load(replica: ReplicaDep) -> OrjsonResponse:
    """The legacy load shape SGLang keeps behind /get_load."""
    load = _load_snapshot(replica)
    return OrjsonResponse(
        [
            {
                "dp_rank": 0,
                "num_reqs": load["num_running_reqs"] + load["num_waiting_reqs"],
                "num_waiting_reqs": load["num_waiting_reqs"],
                "num_tokens": load["num_total_tokens"],
                "num_pending_tokens": load["num_total_tokens"] - load["num_used_tokens"],
                "ts_tic": time.perf_counter(),
            }
        ]
    )


@router.get("/v1/loads")
async def loads(replica: ReplicaDep) -> OrjsonResponse:
    config, preset = replica.config, replica.config.preset_spec
    load = _load_snapshot(replica)
    load["memory"] = {
        "weight_gb": round(preset.weight_bytes_per_gpu / GIB, 3),
        "kv_cache_gb": round(config.max_total_num_tokens * preset.kv_bytes_per_token_per_gpu / GIB, 3),
        "graph_gb": 0.0,
        "token_capacity": config.max_total_num_tokens,
    }
    load["queues"] = {
        "waiting": load["num_waiting_reqs"],
        "grammar": 0,
        "paused": 0,
        "retracted": 0,
        "prealloc_ready": 0,
    }
    return OrjsonResponse(
        {
            "timestamp": datetime.now(UTC).isoformat(),
            "version": SGLANG_VERSION,
            "accelerator": preset.gpu.name,
            "num_accelerators": preset.tp_size,
            "loads": [load],
        }
    )


@router.get("/metrics")
async def metrics(replica: ReplicaDep) -> Response:
    if not replica.config.enable_metrics:
        return OrjsonResponse({"detail": "Not Found"}, status_code=404)  # SGLang mounts it only with the flag
    return Response(content=replica.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/sim/metrics")
async def simulator_metrics(replica: ReplicaDep) -> Response:
    """The same page whatever the flags: the simulator's own, for benchmarks that measure replicas started on
    SGLang's bare defaults (no gateway reads it)."""
    return Response(content=replica.metrics.render(), media_type=CONTENT_TYPE_LATEST)
