"""The figures of an estimate, one frozen value per step, so the table and the JSON report the same numbers."""

from __future__ import annotations

from dataclasses import dataclass

from spillgate.gateway.plan.inputs import PlanInputs


@dataclass(frozen=True)
class Memory:
    """One replica's memory: what the weights leave for the KV cache and how many requests that holds."""

    weight_bytes: float
    usable_bytes: float
    kv_bytes_per_token: float
    kv_capacity_bytes: float
    kv_capacity_tokens: int
    kv_bytes_per_request: float
    concurrency: int


@dataclass(frozen=True)
class Fleet:
    rps_per_replica: float
    required_rps: float
    replicas: int
    gpus: int
    cost_per_day: float | None
    """USD per day for every GPU around the clock; ``None`` without a GPU price."""


@dataclass(frozen=True)
class Hosted:
    """The same average traffic sent to a hosted API instead."""

    avg_rps: float
    requests_per_day: float
    input_tokens_per_day: float
    output_tokens_per_day: float
    cost_per_day: float


@dataclass(frozen=True)
class Little:
    """Little's law, L = lambda x W, at the operating point: the request duration the figures imply."""

    implied_request_s: float
    implied_ms_per_output_token: float
    measured_request_s: float | None
    measured_rps: float | None
    deviation_pct: float | None
    consistent: bool | None


@dataclass(frozen=True)
class Decode:
    """HBM bounds on decode: one request alone, and the whole batch at the operating concurrency."""

    single_request_max_tps: float
    min_tpot_ms: float
    batch_ceiling_tps: float
    per_request_tps: float
    ceiling_used_pct: float


@dataclass(frozen=True)
class Plan:
    inputs: PlanInputs
    memory: Memory
    fleet: Fleet
    hosted: Hosted | None
    little: Little
    decode: Decode
    warnings: tuple[str, ...]
