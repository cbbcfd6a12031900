"""What a simulated replica is asked to be, and the SGLang server arguments that follow from it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from spillgate.backends.sim.kv_events import KvEventsConfig, parse_kv_events_config
from spillgate.backends.sim.presets import Preset, get_preset
from spillgate.backends.sim.scheduler import SchedulerLimits

SGLANG_VERSION = "0.5.23"
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams default for /generate
MAX_PREFILL_TOKENS = 16384


@dataclass(frozen=True)
class ReplicaConfig:
    """Options of ``spillgate sim-replica``, under SGLang's flag names and with SGLang's defaults; ``None`` means
    "as SGLang would pick for the preset"."""

    preset: str = "llama-3.1-8b-h100"
    host: str = "127.0.0.1"
    port: int = 30000
    time_scale: float = 1.0
    model_name: str | None = None
    max_total_tokens: int | None = None
    page_size: int = 1
    chunked_prefill_size: int | None = None
    max_running_requests: int | None = None
    seed: int = 0
    context_length_override: int | None = None
    """``--context-length``: shorter than the model's own."""
    enable_metrics: bool = False
    """``--enable-metrics``: without it SGLang serves no ``/metrics`` (404)."""
    enable_cache_report: bool = False
    """``--enable-cache-report``: without it ``usage.prompt_tokens_details`` is null."""
    api_key: str | None = None
    """``--api-key``: every route but ``/health*``, ``/ready*`` and ``/metrics*`` needs ``Bearer <key>``."""
    disable_overlap_schedule: bool = False
    schedule_policy: str = "fcfs"
    engine: str = "sglang"
    """Which server's face to show: ``sglang``, or ``vllm`` (backends/sim/vllm_face.py) over the same scheduler."""
    kv_events_config: str | None = None
    """``--kv-events-config``: the JSON the engine's flag takes; without it no KV events are published."""
    tool_call_parser: str | None = None
    """``--tool-call-parser``: SGLang turns a forced tool call into ``tool_calls`` only with a parser named (without
    one the call's JSON stays in ``content``); vLLM refuses every ``tool_choice`` but "none" without it and
    ``--enable-auto-tool-choice``."""
    enable_auto_tool_choice: bool = False
    """vLLM's ``--enable-auto-tool-choice``: its tool parser exists only with this and ``--tool-call-parser``."""
    enable_response_store: bool = False
    """SGLang's ``--enable-response-store``: without it ``previous_response_id`` and retrieving a response are refused
    (vLLM reads ``VLLM_ENABLE_RESPONSES_API_STORE`` instead: ``responses_store.py``)."""
    dp_size: int = 1
    """``--dp-size`` (vLLM's ``--data-parallel-size``): schedulers in this server, each with its own KV cache of
    ``max_total_num_tokens`` and its own KV-event publisher (:mod:`backends.sim.data_parallel`)."""

    @cached_property
    def kv_events(self) -> KvEventsConfig | None:
        """The parsed ``--kv-events-config`` (ValueError if the engine would refuse it)."""
        return parse_kv_events_config(self.engine, self.kv_events_config, self.dp_size)

    @cached_property
    def preset_spec(self) -> Preset:
        return get_preset(self.preset)

    @cached_property
    def model_path(self) -> str:
        return self.preset_spec.model.hf_name

    @cached_property
    def served_model_name(self) -> str:
        return self.model_name or self.model_path

    @cached_property
    def context_length(self) -> int:
        return self.context_length_override or self.preset_spec.served_context_length

    @cached_property
    def mem_fraction_static(self) -> float:
        return self.preset_spec.default_mem_fraction_static()

    @cached_property
    def max_total_num_tokens(self) -> int:
        return self.preset_spec.max_total_num_tokens(max_total_tokens=self.max_total_tokens, page_size=self.page_size)

    @cached_property
    def resolved_chunked_prefill_size(self) -> int:
        if self.chunked_prefill_size is not None:
            return self.chunked_prefill_size
        return self.preset_spec.default_chunked_prefill_size()

    @cached_property
    def resolved_max_running_requests(self) -> int:
        """SGLang's estimate: 512 requests per context-length of KV, within [2048, 4096]."""
        if self.max_running_requests is not None:
            return self.max_running_requests
        estimate = int(self.max_total_num_tokens / self.context_length * 512)
        return min(max(min(estimate, 4096), 2048), max(1, self.max_total_num_tokens // 2))

    @cached_property
    def max_req_len(self) -> int:
        """Longest prompt plus output one request may have: bounded by context and KV pool."""
        return min(self.context_length - 1, self.max_total_num_tokens - 1)

    @cached_property
    def max_req_input_len(self) -> int:
        return self.max_req_len - 5

    def scheduler_limits(self) -> SchedulerLimits:
        chunk = self.resolved_chunked_prefill_size
        return SchedulerLimits(
            max_total_num_tokens=self.max_total_num_tokens,
            page_size=self.page_size,
            chunked_prefill_size=chunk if chunk > 0 else None,
            max_running_requests=self.resolved_max_running_requests,
            max_prefill_tokens=MAX_PREFILL_TOKENS,
            overlap=not self.disable_overlap_schedule,
        )

    def server_args(self) -> dict[str, Any]:
        """The resolved server arguments, under SGLang's ServerArgs field names."""
        preset = self.preset_spec
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "tokenizer_mode": "auto",
            "skip_tokenizer_init": False,
            "load_format": "auto",
            "trust_remote_code": False,
            "dtype": "auto",
            "kv_cache_dtype": "auto",
            "quantization": "fp8" if preset.model.weight_bytes_per_param == 1 else None,
            "context_length": self.context_length_override,
            "device": "cuda",
            "served_model_name": self.served_model_name,
            "is_embedding": False,
            "host": self.host,
            "port": self.port,
            "mem_fraction_static": self.mem_fraction_static,
            # Null unless set by flag, as in SGLang: the limit it applies is in internal_states.
            "max_running_requests": self.max_running_requests,
            "max_queued_requests": None,
            "max_total_tokens": self.max_total_tokens or preset.max_total_tokens,
            "chunked_prefill_size": self.resolved_chunked_prefill_size,
            "max_prefill_tokens": MAX_PREFILL_TOKENS,
            "schedule_policy": self.schedule_policy,
            "schedule_conservativeness": 1.0,
            "enable_priority_scheduling": False,
            "page_size": self.page_size,
            "tp_size": preset.tp_size,
            "pp_size": 1,
            "dp_size": self.dp_size,
            "ep_size": 1,
            "stream_interval": 1,
            "incremental_streaming_output": False,
            "random_seed": self.seed,
            "log_level": "warning",
            "enable_metrics": self.enable_metrics,
            "enable_cache_report": self.enable_cache_report,
            "disable_overlap_schedule": self.disable_overlap_schedule,
            "decode_log_interval": 40,
            "disable_radix_cache": False,
            "radix_eviction_policy": "lru",
            "enable_mixed_chunk": False,
            "disaggregation_mode": "null",
            "kv_events_config": self.kv_events_config,
            "tool_call_parser": self.tool_call_parser,
            "api_key": self.api_key,  # SGLang shows it to whoever holds it
            "weight_version": "default",
        }
