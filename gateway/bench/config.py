"""What one benchmark run does: target, workload and its knobs, load shape, limits and SLOs.

One frozen value so the CLI, the Python API and the JSON report all describe a run the same way.
"""

from __future__ import annotations

import dataclasses
import math
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from spillgate.gateway.bench.arrivals import RateSchedule, parse_rate_schedule

WORKLOADS = ("gsp", "chat", "agent")
SESSION_ORDERS = ("random", "fifo")
GROUP_DISTRIBUTIONS = ("uniform", "zipf")
TRACE_PREFIX = "trace:"


@dataclass(frozen=True)
class GspKnobs:
    """SGLang's generated-shared-prefix benchmark: groups of questions behind one long system prompt."""

    groups: int = 64
    prompts_per_group: int = 16
    system_tokens: int = 2048
    question_tokens: int = 128
    output_tokens: int = 256
    group_distribution: str = "uniform"
    """``uniform``: every group gets ``prompts_per_group`` requests. ``zipf`` (SGLang's ``--gsp-group-distribution
    zipf``): each request's group is drawn with probability 1/rank**``zipf_alpha`` (normalized; rank 1, the
    hottest, is group 0), for the same total of requests: a few hot prefixes and a long tail."""
    zipf_alpha: float = 1.1

    def group_weights(self) -> list[float] | None:
        """Each group's relative popularity under ``zipf``; ``None`` for uniform."""
        if self.group_distribution == "uniform":
            return None
        return [1.0 / rank**self.zipf_alpha for rank in range(1, self.groups + 1)]


@dataclass(frozen=True)
class ChatKnobs:
    """Multi-turn sessions: each turn resends the whole conversation so far plus a new user message."""

    sessions: int = 32
    turns: int = 6
    user_tokens: int = 256
    output_tokens: int = 128


@dataclass(frozen=True)
class AgentKnobs:
    """Agent loops: one long tool-definition prefix shared by every session, then short steps."""

    sessions: int = 16
    steps: int = 8
    tool_tokens: int = 4096
    step_tokens: int = 64
    output_tokens: int = 64


@dataclass(frozen=True)
class BenchConfig:
    """A benchmark run. ``workload`` is ``gsp``, ``chat``, ``agent`` or ``trace:PATH``.

    Load shape: ``rate`` (open loop, Poisson), or ``rate_schedule`` (open loop, Poisson at a rate that steps
    from phase to phase, e.g. ``0.6x:60,3x:60,0.6x:60`` with ``capacity_rps`` for the ``x`` entries), or
    ``concurrency`` (closed loop; several levels make a sweep), or none for a trace (replayed on its own
    timestamps divided by ``trace_speedup``).
    Limits per level: ``num_requests`` and/or ``duration_s``; with neither, the workload's natural size (a
    schedule ends with its last phase). ``warmup_s`` measures a steady state: requests sent in each level's
    first seconds fill caches and queues but are not counted; the limits include them.
    """

    url: str
    more_urls: tuple[str, ...] = ()
    """Further URLs of the same service, such as the other processes of a gateway: requests rotate over ``url``
    and these, one after another, as a load balancer without affinity would send them."""
    workload: str = "gsp"
    api_key: str | None = None
    model: str | None = None
    rate: float | None = None
    rate_schedule: str | None = None
    capacity_rps: float | None = None
    concurrency: tuple[int, ...] = ()
    duration_s: float | None = None
    num_requests: int | None = None
    warmup_s: float = 0.0
    """Requests sent in each level's first ``warmup_s`` seconds load the server but are left out of its figures."""
    session_order: str = "random"
    """chat and agent: which ready session sends next, ``random`` (SGLang's multi-turn default) or ``fifo``."""
    session_script: tuple[int, ...] | None = None
    """chat and agent, for comparison scripts: send exactly these sessions' turns in this order (the ``session``
    of another run's results), one request at a time."""
    trace_speedup: float = 1.0
    trace_block_tokens: int = 512
    """Tokens per trace block: below Mooncake's 512 every prompt shrinks by the same factor, sharing kept."""
    trace_max_output_tokens: int | None = None
    """Cap on each trace record's output length."""
    slo_ttft_ms: float = 1000.0
    slo_tpot_ms: float = 50.0
    seed: int = 0
    request_timeout_s: float = 300.0
    connect_timeout_s: float = 5.0
    gsp: GspKnobs = field(default_factory=GspKnobs)
    chat: ChatKnobs = field(default_factory=ChatKnobs)
    agent: AgentKnobs = field(default_factory=AgentKnobs)

    @property
    def urls(self) -> tuple[str, ...]:
        """Every URL requests are sent to, in rotation order."""
        return (self.url, *self.more_urls)

    @property
    def trace_path(self) -> str | None:
        return self.workload[len(TRACE_PREFIX) :] if self.workload.startswith(TRACE_PREFIX) else None

    @property
    def workload_kind(self) -> str:
        return "trace" if self.trace_path is not None else self.workload

    @property
    def mode(self) -> str:
        """``rate``, ``schedule``, ``concurrency`` or ``trace`` (replay on the trace's own clock)."""
        if self.rate is not None:
            return "rate"
        if self.rate_schedule is not None:
            return "schedule"
        if self.concurrency:
            return "concurrency"
        return "trace"

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first setting that cannot work."""
        numbers = (self.rate, self.capacity_rps, self.duration_s, self.warmup_s, self.trace_speedup)
        numbers += (self.request_timeout_s, self.connect_timeout_s, self.slo_ttft_ms, self.slo_tpot_ms)
        if any(value is not None and not math.isfinite(value) for value in numbers):
            raise ValueError("rates, durations, timeouts and SLOs must be finite numbers")
        for url in self.urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"--url must be an http(s) URL, got {url!r}")
            if not _valid_port(url):
                raise ValueError(f"--url has an invalid port: {url!r}")
        if self.workload not in WORKLOADS and not self.trace_path:
            raise ValueError(f"--workload must be one of {', '.join(WORKLOADS)} or trace:PATH, got {self.workload!r}")
        shapes = [self.rate is not None, self.rate_schedule is not None, bool(self.concurrency)]
        if sum(shapes) > 1:
            raise ValueError("--rate, --rate-schedule and --concurrency are exclusive")
        if not any(shapes) and self.trace_path is None:
            raise ValueError(
                "pass --rate or --rate-schedule (open loop) or --concurrency (closed loop); only traces replay on "
                "their own"
            )
        if self.capacity_rps is not None and self.capacity_rps <= 0:
            raise ValueError("--capacity-rps must be positive")
        if self.rate_schedule is not None:
            self.schedule()
        if self.rate is not None and self.rate <= 0:
            raise ValueError("--rate must be positive")
        if any(level < 1 for level in self.concurrency):
            raise ValueError("--concurrency levels must be at least 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("--duration must be positive")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError("--num-requests must be at least 1")
        if self.session_script is not None and (self.workload not in ("chat", "agent") or self.concurrency != (1,)):
            raise ValueError("a session script replays chat or agent turns at concurrency 1")
        if self.session_order not in SESSION_ORDERS:
            raise ValueError(f"--session-order must be one of {', '.join(SESSION_ORDERS)}, got {self.session_order!r}")
        if self.warmup_s < 0:
            raise ValueError("--warmup must be zero or positive")
        if self.duration_s is not None and self.warmup_s >= self.duration_s:
            raise ValueError("--warmup must be shorter than --duration")
        if self.trace_speedup <= 0:
            raise ValueError("--trace-speedup must be positive")
        if self.trace_block_tokens < 1:
            raise ValueError("--trace-block-tokens must be at least 1")
        if self.trace_max_output_tokens is not None and self.trace_max_output_tokens < 1:
            raise ValueError("--trace-max-output-tokens must be at least 1")
        if self.request_timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        if self.slo_ttft_ms <= 0 or self.slo_tpot_ms <= 0:
            raise ValueError("--slo-ttft-ms and --slo-tpot-ms must be positive")
        for knobs in (self.gsp, self.chat, self.agent):
            for knob in dataclasses.fields(knobs):
                value = getattr(knobs, knob.name)
                if isinstance(value, int) and value < 1:
                    raise ValueError(f"{type(knobs).__name__}.{knob.name} must be at least 1")
        if self.gsp.group_distribution not in GROUP_DISTRIBUTIONS:
            raise ValueError(f"--gsp-group-distribution must be one of {', '.join(GROUP_DISTRIBUTIONS)}")
        if not math.isfinite(self.gsp.zipf_alpha) or self.gsp.zipf_alpha <= 0:
            raise ValueError("--gsp-zipf-alpha must be a finite number above 0")

    def schedule(self) -> RateSchedule:
        """The parsed ``rate_schedule``; ``ValueError`` when it is missing or malformed."""
        if self.rate_schedule is None:
            raise ValueError("no --rate-schedule")
        return parse_rate_schedule(self.rate_schedule, self.capacity_rps)

    def levels(self) -> list[int | None]:
        """One entry per run: the concurrency levels of a sweep, or a single ``None`` for open loop."""
        return list(self.concurrency) if self.concurrency else [None]

    def to_dict(self) -> dict[str, Any]:
        """The config for the JSON report, without the API key."""
        data = dataclasses.asdict(self)
        data["api_key"] = "***" if self.api_key else None
        data["concurrency"] = list(self.concurrency)
        if self.session_script is not None:
            data["session_script"] = f"{len(self.session_script)} turns"
        data["mode"] = self.mode
        return data


def _valid_port(url: str) -> bool:
    """Whether ``url``'s port, if it names one, is a number from 0 to 65535."""
    try:
        urllib.parse.urlsplit(url).port  # noqa: B018  (raises ValueError on a bad one)
    except ValueError:
        return False
    return True
