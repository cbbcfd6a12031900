"""``spillgate plan --from URL``: the plan from a running gateway's own measurements (its ``GET /capacity``).

The gateway knows each pool's recent peak, request sizes, one replica's throughput at the SLO (measured or
configured) and its price, but not the model or the GPUs inside a replica: so this plan is the fleet and the
cost (steps 3 and 4 of the estimate, by :func:`~gateway.plan.estimate.fleet` and
:func:`~gateway.plan.estimate.hosted` themselves), per pool, with one replica priced at ``gpu_usd_per_hour``.
The gateway sizes its pools with the same :func:`pool_fleet` (:mod:`gateway.capacity.advice`), so both agree.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import orjson

from spillgate.gateway.plan.estimate import HOURS_PER_DAY, fleet, hosted
from spillgate.gateway.plan.formatting import num, pct, sig, usd
from spillgate.gateway.plan.inputs import GpuSpec, HostedPrices, OperatingPoint, PlanError, Traffic
from spillgate.gateway.plan.render import clean_floats
from spillgate.gateway.plan.results import Fleet, Hosted

TOKEN_ENV = "SPILLGATE_METRICS_TOKEN"
"""Where ``--from`` finds the gateway's ``metrics.token`` when ``--token`` is not given."""
TIMEOUT_S = 10.0
JSON_VERSION = 1
_CAPACITY_VERSION = 1
"""The ``/capacity`` report version this reads."""


def live_traffic(
    peak_rps: float, mean_input_tokens: float, mean_output_tokens: float, headroom: float, avg_to_peak: float = 1.0
) -> Traffic:
    """The plan's traffic from measured means (not whole numbers: the plan only divides by them)."""
    return Traffic(mean_input_tokens, mean_output_tokens, peak_rps, headroom, avg_to_peak)  # type: ignore[arg-type]


def replica_gpu(pool: str, usd_per_hour: float) -> GpuSpec:
    """A pool's replica as the plan's GPU at TP 1: the plan's GPUs are then replicas, at the replica's price.
    Memory and bandwidth are unknown here and unused by the fleet."""
    return GpuSpec(pool, memory_gb=0.0, bandwidth_tbs=0.0, price_per_hour=usd_per_hour)


def pool_fleet(traffic: Traffic, output_tps: float, gpu: GpuSpec) -> Fleet:
    """Replicas for the peak with headroom, the plan's own arithmetic (the concurrency is not needed for it)."""
    return fleet(OperatingPoint(concurrency=0, output_tps=output_tps), traffic, gpu, tp=1)


def gateway_url(value: str) -> str:
    """A gateway's base URL, for argparse: http(s)://host[:port], no trailing slash."""
    if not value.startswith(("http://", "https://")) or len(value.split("://", 1)[1].strip("/")) == 0:
        raise argparse.ArgumentTypeError(f"expected the gateway's URL, like http://127.0.0.1:8080, got {value!r}")
    return value.rstrip("/")


def fetch_capacity(url: str, token: str | None, timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    """The gateway's capacity report; :class:`PlanError`, one line, when it cannot be had."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(f"{url}/capacity", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise PlanError(f"--from: cannot reach {url}: {reason}") from None
    if response.status_code in (401, 403):
        if token:
            raise PlanError(f"--from: {url} refused the metrics token (HTTP {response.status_code})")
        raise PlanError(f"--from: {url} needs its metrics token: pass --token or set {TOKEN_ENV}")
    if response.status_code == 404:
        raise PlanError(f"--from: {url} has no /capacity: is it a spillgate gateway?")
    if response.status_code != 200:
        raise PlanError(f"--from: {url}/capacity answered HTTP {response.status_code}")
    try:
        report = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        report = None
    if not isinstance(report, dict) or report.get("version") != _CAPACITY_VERSION or "pools" not in report:
        raise PlanError(f"--from: {url}/capacity is not a capacity report this version of spillgate reads")
    return report


@dataclass(frozen=True)
class LivePlan:
    """One pool's plan from the gateway's measurements, beside the gateway's own recommendation."""

    pool: str
    current_replicas: int
    recommended_replicas: int
    """The gateway's figure: this plan's replicas, raised by sustained pressure or the warm minimum."""
    reason: str
    traffic: Traffic | None
    """``None`` until the gateway has seen a request's size."""
    output_tps: float
    output_tps_source: str
    gpu_usd_per_hour: float
    fleet: Fleet | None
    hosted_prices: HostedPrices | None
    hosted: Hosted | None
    """The measured mean traffic on the hosted API, when the pool's routes have a hosted price."""
    overflow_requests: float
    overflow_usd: float
    refused_requests: float
    queue_depth: int
    kv_usage: float
    pressure_s: float
    sustain_s: float

    @property
    def recommended_cost_per_day(self) -> float:
        return self.recommended_replicas * self.gpu_usd_per_hour * HOURS_PER_DAY


def plan_pool(pool: dict[str, Any]) -> LivePlan:
    """The plan of one pool of a capacity report (``gateway.capacity.api.report_json``'s shape)."""
    demand, throughput, pressure, cost = pool["demand"], pool["throughput"], pool["pressure"], pool["cost"]
    peak, mean = demand["peak_rps"], demand["mean_rps"]
    price = cost["hosted_price"]
    prices = HostedPrices(price["input_per_mtok"], price["output_per_mtok"]) if price else None
    traffic = planned = hosted_cost = None
    if demand["mean_output_tokens"]:
        avg_to_peak = min(1.0, mean / peak) if peak > 0 else 1.0
        traffic = live_traffic(
            peak, demand["mean_input_tokens"] or 0.0, demand["mean_output_tokens"], pool["headroom"], avg_to_peak
        )
        gpu = replica_gpu(pool["pool"], cost["gpu_usd_per_hour"])
        planned = pool_fleet(traffic, throughput["output_tps_per_replica"], gpu)
        if prices is not None and mean > 0:
            hosted_cost = hosted(traffic, prices)
    return LivePlan(
        pool=pool["pool"],
        current_replicas=pool["replicas"],
        recommended_replicas=pool["recommended_replicas"],
        reason=pool["reason"],
        traffic=traffic,
        output_tps=throughput["output_tps_per_replica"],
        output_tps_source=throughput["source"],
        gpu_usd_per_hour=cost["gpu_usd_per_hour"],
        fleet=planned,
        hosted_prices=prices,
        hosted=hosted_cost,
        overflow_requests=demand["overflow_requests"],
        overflow_usd=demand["overflow_usd"],
        refused_requests=demand.get("refused_requests", 0.0),
        queue_depth=pressure["queue_depth"],
        kv_usage=pressure["kv_usage"],
        pressure_s=pressure["for_s"],
        sustain_s=pressure["sustain_s"],
    )


def plan_report(report: dict[str, Any]) -> list[LivePlan]:
    try:
        return [plan_pool(pool) for pool in report["pools"]]
    except (KeyError, TypeError, ValueError, ArithmeticError) as exc:
        raise PlanError(f"--from: the capacity report has a missing or bad field ({exc!r})") from None


def to_json(url: str, report: dict[str, Any], plans: list[LivePlan]) -> dict[str, Any]:
    """Per pool: the headline figures as ``spillgate plan --json`` names them, then each step."""
    return clean_floats(
        {
            "version": JSON_VERSION,
            "source": url,
            "rate_window_s": report.get("rate_window_s"),
            "lookback_s": report.get("lookback_s"),
            "observed_s": report.get("observed_s"),
            "pools": [
                {
                    "pool": p.pool,
                    "current_replicas": p.current_replicas,
                    "recommended_replicas": p.recommended_replicas,
                    "reason": p.reason,
                    "inputs": {
                        "traffic": asdict(p.traffic) if p.traffic is not None else None,
                        "output_tps": p.output_tps,
                        "output_tps_source": p.output_tps_source,
                        "gpu_usd_per_hour": p.gpu_usd_per_hour,
                        "hosted": asdict(p.hosted_prices) if p.hosted_prices is not None else None,
                    },
                    "rps_per_replica": p.fleet.rps_per_replica if p.fleet else None,
                    "replicas": p.fleet.replicas if p.fleet else None,
                    "gpu_cost_per_day": p.fleet.cost_per_day if p.fleet else None,
                    "recommended_cost_per_day": p.recommended_cost_per_day,
                    "hosted_cost_per_day": p.hosted.cost_per_day if p.hosted else None,
                    "overflow_requests": p.overflow_requests,
                    "overflow_usd": p.overflow_usd,
                    "refused_requests": p.refused_requests,
                    "fleet": asdict(p.fleet) if p.fleet else None,
                    "hosted": asdict(p.hosted) if p.hosted else None,
                }
                for p in plans
            ],
        }
    )


def _pool_rows(p: LivePlan, window: str, lookback: str) -> list[tuple[str, str, str]]:
    now = f"{p.current_replicas} replica{'' if p.current_replicas == 1 else 's'} now"
    rows = [(f'pool "{p.pool}" ({now})', "", "")]

    def row(label: str, value: str, why: str = "") -> None:
        rows.append((f"  {label}", value, why))

    source = "measured at saturation within the SLO" if p.output_tps_source == "measured" else "configured"
    row("output tokens/s", num(p.output_tps), f"per replica, {source}")
    traffic, fl = p.traffic, p.fleet
    if traffic is None or fl is None:
        row("peak demand", "-", "no request measured yet")
    else:
        row(
            "peak demand",
            f"{sig(traffic.peak_rps)} RPS",
            f"highest {window} mean in the last {lookback}; {num(traffic.input_tokens)} in / "
            f"{num(traffic.output_tokens)} out tokens per request",
        )
        per_replica = f"{num(p.output_tps)} / {num(traffic.output_tokens)} output tokens"
        row("RPS per replica", sig(fl.rps_per_replica), per_replica)
        row(
            "required capacity",
            f"{sig(fl.required_rps)} RPS",
            f"{sig(traffic.peak_rps)} peak + {pct(traffic.headroom)} headroom",
        )
        row("replicas", f"{fl.replicas}", f"{sig(fl.required_rps)} / {sig(fl.rps_per_replica)}, rounded up")
    pressure = (
        f"queue {p.queue_depth}, KV {pct(round(p.kv_usage, 3))}, pressure for {p.pressure_s:.0f} of {p.sustain_s:g} s"
    )
    row("recommended", f"{p.recommended_replicas}", f"the gateway's figure ({p.reason}); {pressure}")
    row(
        "replicas per day",
        usd(p.recommended_cost_per_day),
        f"{p.recommended_replicas} x {usd(p.gpu_usd_per_hour)}/replica-hour x {HOURS_PER_DAY} h",
    )
    if p.hosted is not None and p.hosted_prices is not None and traffic is not None:
        row(
            "hosted API per day",
            usd(p.hosted.cost_per_day),
            f"{p.hosted.requests_per_day:,.0f} requests/day at the measured mean rate; "
            f"{usd(p.hosted_prices.input_per_mtok)}/M in, {usd(p.hosted_prices.output_per_mtok)}/M out",
        )
    row("overflow to hosted", usd(p.overflow_usd), f"{p.overflow_requests:,.0f} requests in the last {lookback}")
    if p.refused_requests:
        row("refused", f"{p.refused_requests:,.0f}", f"requests turned away as over capacity in the last {lookback}")
    return rows


def format_table(url: str, report: dict[str, Any], plans: list[LivePlan]) -> str:
    """Each pool's plan with the arithmetic behind each figure, as ``spillgate plan`` prints its own."""
    window, lookback = f"{report.get('rate_window_s', 0):g} s", f"{report.get('lookback_s', 0):g} s"
    rows = [r for p in plans for r in _pool_rows(p, window, lookback)]
    lines = [f"spillgate plan --from {url}: {len(plans)} pool(s), measured over {report.get('observed_s', 0):.0f} s"]
    if not rows:
        return lines[0]
    width = max(len(label) for label, value, _ in rows if value)
    value_width = max(len(value) for _, value, _ in rows)
    for label, value, why in rows:
        if not value:
            lines.extend(["", label])
            continue
        lines.append(f"{label.ljust(width)}  {value.rjust(value_width)}  {why}".rstrip())
    return "\n".join(lines)


def run_live(args: argparse.Namespace) -> int:
    """``spillgate plan --from URL [--token T] [--json]``."""
    url = args.from_url
    token = args.token or os.environ.get(TOKEN_ENV) or None
    try:
        report = fetch_capacity(url, token)
        plans = plan_report(report)
    except PlanError as exc:
        print(f"spillgate plan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(orjson.dumps(to_json(url, report, plans), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(format_table(url, report, plans))
    return 0
