"""The workloads the router comparison runs, sized for a 2-core machine, and their offered loads.

Times here are simulated seconds: the replicas run ``time_scale`` wall seconds per simulated second, so the
load generator is given ``rate / time_scale`` and SLOs of ``slo * time_scale``, and every measured time is
divided by ``time_scale`` again before it is reported.

Default rates were measured once with ``--find-rate`` (a Poisson sweep through sglang-router cache_aware on
4 replicas, time scale 6, 4 simulated seconds of arrivals per rate). "Saturated" is where the median TTFT
jumps (requests start to queue for prefill): gsp's median TTFT was 17 / 28 / 318 / 323 ms at 100 / 130 /
160 / 190 req/s, so saturation ~160 and 110 is ~70% of it; chat's was 41 / 72 / 99 / 229 ms at 60 / 80 /
100 / 120 req/s (and at 100+ the sessions could no longer keep up with the offered rate), so ~100 and 70.
gsp-zipf repeats its hot prefixes, so less of it is prefill: its median TTFT was 16 / 29 / 35 /
52 ms at 100 / 220 / 260 / 300 req/s, so ~300 and 210. At these rates a cache-aware router keeps the
cluster 60-80% busy; round robin, which prefills far more of each prompt, overloads it, which is the point of
routing by cache.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from spillgate.gateway.bench.config import BenchConfig, ChatKnobs, GspKnobs

GSP = GspKnobs(groups=64, prompts_per_group=8, system_tokens=2048, question_tokens=128, output_tokens=64)
"""512 prompts behind 64 shared 2k-token system prompts, in a seeded shuffled order; short replies keep the
per-token cost of streaming (which this machine pays three times: replica, relay, client) small."""

GSP_ZIPF = dataclasses.replace(GSP, group_distribution="zipf", zipf_alpha=1.1)
"""The same prompts with each request's group drawn by popularity 1/rank**1.1 (SGLang's ``--gsp-group-distribution
zipf``): the hottest of the 64 groups gets ~25% of the requests, a whole replica's share of the load."""

CHAT = ChatKnobs(sessions=128, turns=6, user_tokens=1024, output_tokens=32)
"""128 conversations of up to 6 turns, each turn resending the conversation so far plus a 1k-token message,
so prefill (what a cache saves) dominates. A turn is sent only once the previous one answered: 128 live
sessions with short replies keep a ready session at hand at the default rate, so the offered load stays
(nearly) open loop; a router that slows turns down gets fewer requests, which the report's offered rate shows."""


@dataclass(frozen=True)
class WorkloadSpec:
    """A column group of the table: what to send and at what simulated rate."""

    name: str
    workload: str
    rate: float | None
    """Requests per simulated second (Poisson); ``None`` for a trace, replayed on its own clock."""
    gsp: GspKnobs = GSP
    chat: ChatKnobs = CHAT
    trace_speedup: float = 1.0
    trace_requests: int | None = None
    trace_block_tokens: int = 512
    """Tokens per trace block: below Mooncake's 512 every prompt shrinks alike, its sharing kept."""
    trace_max_output: int | None = None
    """Cap on each trace record's output tokens."""

    def num_requests(self, duration_s: float) -> int | None:
        """Requests per run: ``rate x duration``, so every row sends exactly the same sequence."""
        if self.rate is None:
            return self.trace_requests
        return max(1, round(self.rate * duration_s))

    def bench_config(
        self,
        url: str,
        *,
        more_urls: Sequence[str] = (),
        model: str,
        api_key: str | None,
        time_scale: float,
        duration_s: float,
        slo: tuple[float, float],
        warmup_s: float = 0.0,
        session_order: str = "random",
        seed: int = 0,
    ) -> BenchConfig:
        """The ``spillgate bench`` run for one row, in wall-clock units: ``warmup_s`` then ``duration_s`` of
        arrivals, only those after the warm-up counted."""
        ttft_ms, tpot_ms = slo
        return BenchConfig(
            url=url,
            more_urls=tuple(more_urls),
            workload=self.workload,
            api_key=api_key,
            model=model,
            rate=None if self.rate is None else self.rate / time_scale,
            num_requests=self.num_requests(warmup_s + duration_s),
            warmup_s=warmup_s * time_scale,
            session_order=session_order,
            seed=seed,
            trace_speedup=self.trace_speedup / time_scale,
            trace_block_tokens=self.trace_block_tokens,
            trace_max_output_tokens=self.trace_max_output,
            slo_ttft_ms=ttft_ms * time_scale,
            slo_tpot_ms=tpot_ms * time_scale,
            request_timeout_s=120.0 * max(1.0, time_scale),
            gsp=self.gsp,
            chat=self.chat,
        )

    def with_rate(self, rate: float) -> WorkloadSpec:
        return dataclasses.replace(self, rate=rate)


DEFAULT_RATES = {"gsp": 110.0, "gsp-zipf": 210.0, "chat": 70.0}
SWEEP_RATES = {
    "gsp": (100.0, 130.0, 160.0, 190.0),
    "gsp-zipf": (100.0, 220.0, 260.0, 300.0),
    "chat": (60.0, 80.0, 100.0, 120.0),
}


def workload_spec(
    name: str,
    *,
    trace_speedup: float,
    trace_requests: int,
    trace_block_tokens: int = 512,
    trace_max_output: int | None = None,
) -> WorkloadSpec:
    """``gsp``, ``chat`` or ``trace:PATH`` (replayed at ``trace_speedup`` x its own clock, first N records,
    ``trace_block_tokens`` tokens a block, outputs capped at ``trace_max_output``)."""
    if name == "gsp-zipf":
        return WorkloadSpec(name=name, workload="gsp", rate=DEFAULT_RATES[name], gsp=GSP_ZIPF)
    if name in DEFAULT_RATES:
        return WorkloadSpec(name=name, workload=name, rate=DEFAULT_RATES[name])
    if name.startswith("trace:"):
        return WorkloadSpec(
            name="trace",
            workload=name,
            rate=None,
            trace_speedup=trace_speedup,
            trace_requests=trace_requests,
            trace_block_tokens=trace_block_tokens,
            trace_max_output=trace_max_output,
        )
    raise ValueError(f"unknown workload {name!r}: use gsp, gsp-zipf, chat or trace:PATH")


def parse_rates(text: str | None, names: list[str]) -> dict[str, list[float]]:
    """``--rate 80`` (every Poisson workload) or ``--rate gsp=90,chat=60``; ``/`` lists rates for ``--find-rate``."""
    if not text:
        return {}
    if "=" not in text:
        return {name: _rates(text) for name in names}
    rates = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name.strip() not in names:
            raise ValueError(f"--rate names {name.strip()!r}, which is not a Poisson workload of this run")
        rates[name.strip()] = _rates(value)
    return rates


def _rates(text: str) -> list[float]:
    values = [float(value) for value in text.split("/") if value.strip()]
    if not values or min(values) <= 0:
        raise ValueError(f"--rate values must be positive, got {text!r}")
    return values
