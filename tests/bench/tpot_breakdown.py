"""Where each replica's time per output token goes, router by router, in front of the same simulated replicas.

The setting of ``compare_kv_events`` (simulated Llama-3.1-8B/H100 SGLang replicas publishing KV events, KV
pools holding ``--kv-fraction`` of the workload's working set), one workload at a time, a fresh router process
per run. Around every run each replica's ``/sim/metrics`` and ``/sim/passes`` are read, and per router and
replica the report shows what the replica did (requests, new prefill tokens, prefill passes and their time,
decode steps, mean decode batch and KV read per step) and splits its mean inter-token latency into the decode
steps themselves, the prefill passes the running requests waited on, and a simulator falling behind its time
scale. Against that: the replica's own per-request TPOT (``sglang:request_time_per_output_token_seconds``) and
the TPOT the client measured on the same requests, whose difference is what the relay added. What each request
found on its replica when it arrived (requests decoding, requests queued, prompt tokens cached) and the prompt
tokens cached when it was admitted show where a router sends work and what eviction took while it queued.

Seeds move a row's hit rate by several points, and with it the prefill work and the TPOT, so each workload's
report ends with a fit over all runs: TPOT against the run's new prefill tokens, one slope, an intercept per
row; the intercepts' differences are the rows' TPOT differences at equal prefill work. ``--trace-dir`` keeps,
besides the client's and spillgate's per-request records, every pass, decode step and arrival per replica
(``*-passes.jsonl``: replica index, then the fields of ``/sim/passes/log``).

Rows: ``events`` and ``belief`` (spillgate ``cache_aware`` as in ``compare_kv_events``), ``nohold`` (``events``
with the pool's ``max_waiting_prefill_tokens: 0``: no prompt held at the gateway), ``sticky`` (``events`` with the
route's ``affinity.max_slowdown`` at 1000: no request moved off its warm replica), ``spillgate-POLICY`` (another
spillgate policy on the events), ``sglang-router`` (0.3.2 ``cache_aware``, from its cached venv).

    .venv/bin/python -m tests.bench.tpot_breakdown [--workloads chat,trace:PATH] [--seeds 0,1]
        [--rows events,sglang-router] [--kv-fraction 0.5 | --kv-tokens N] [--trace-dir DIR] [--json FILE]

Times are simulated. Every process is stopped by the PID it was started with.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import signal
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench import router_env
from tests.bench.compare_cluster import Cluster, Relay, start_router, start_spillgate
from tests.bench.compare_kv_events import BELIEF_POOL, PREFIX, specs_of, start_cluster, working_set
from tests.bench.compare_routers import Reference, Run, Settings, _exit_on_sigterm, _progress, measure
from tests.bench.compare_workloads import WorkloadSpec
from tests.bench.services import http_request, run_script
from tests.support.gateway import replica_name

NO_HOLD_POOL = {"max_waiting_prefill_tokens": 0}
STICKY_ROUTE = {"affinity": {"max_slowdown": 1000.0}}
"""``cache_aware`` whose affinity guard never moves a request off the replica holding its longest prefix."""
_SAMPLE = re.compile(r"^(sglang:[a-z0-9_]+)(?:\{[^}]*\})?\s+([0-9.eE+-]+)$")
_METRICS = (
    "sglang:num_requests_total",
    "sglang:prompt_tokens_total",
    "sglang:cached_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:request_time_per_output_token_seconds_sum",
    "sglang:request_time_per_output_token_seconds_count",
)


# Reading the replicas -------------------------------------------------------------------------------------


def read_replica(url: str) -> dict[str, float]:
    """The replica's cumulative pass counters and request counters, one flat mapping."""
    status, body = http_request(url + "/sim/passes")
    if status != 200:
        raise RuntimeError(f"{url}/sim/passes answered {status}")
    out = {key: float(value) for key, value in json.loads(body).items()}
    status, body = http_request(url + "/sim/metrics")
    if status != 200:
        raise RuntimeError(f"{url}/sim/metrics answered {status}")
    for name in _METRICS:
        out[name] = 0.0
    for line in body.decode().splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) in out:
            out[match.group(1)] += float(match.group(2))
    return out


def read_cluster(cluster: Cluster) -> list[dict[str, float]]:
    return [read_replica(url) for url in cluster.urls]


def read_log(url: str, after: float) -> list[list[Any]]:
    """The replica's passes, decode steps and arrivals numbered above ``after`` (``/sim/passes/log``)."""
    status, body = http_request(url + f"/sim/passes/log?after={int(after)}")
    if status != 200:
        raise RuntimeError(f"{url}/sim/passes/log answered {status}")
    return json.loads(body)["records"]


def minus(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before.get(key, 0.0) for key in after}


# One replica's figures ------------------------------------------------------------------------------------


@dataclass
class ReplicaFigures:
    """What one replica did during one run (or the cluster's sum), and the client's view of its requests."""

    delta: dict[str, float]
    client_tpots_ms: list[float] = field(default_factory=list)
    """TPOT of each request the client saw from it, simulated ms (spillgate says which replica served)."""

    def get(self, key: str) -> float:
        return self.delta.get(key, 0.0)

    def per_token_ms(self, key: str) -> float | None:
        tokens = self.get("decode_tokens")
        return 1000.0 * self.get(key) / tokens if tokens else None

    def to_json(self) -> dict[str, Any]:
        tokens = self.get("decode_tokens")
        steps = self.get("decode_passes")
        count = self.get("sglang:request_time_per_output_token_seconds_count")
        prompt = self.get("sglang:prompt_tokens_total")
        arrivals = self.get("arrivals")
        return {
            "requests": self.get("sglang:num_requests_total"),
            "hit": self.get("sglang:cached_tokens_total") / prompt if prompt else None,
            "new_prompt_tokens": prompt - self.get("sglang:cached_tokens_total"),
            "prefill_passes": self.get("prefill_passes"),
            "prefill_tokens": self.get("prefill_tokens"),
            "prefill_s": self.get("prefill_s"),
            "decode_steps": steps,
            "decode_s": self.get("decode_s"),
            "elapsed_s": self.get("now"),
            "mean_decode_batch": tokens / steps if steps else None,
            "decode_step_ms": 1000.0 * self.get("decode_s") / steps if steps else None,
            "kv_tokens_per_step": self.get("decode_context_tokens") / steps if steps else None,
            "itl_decode_ms": self.per_token_ms("decode_token_s"),
            "itl_prefill_stall_ms": self.per_token_ms("stalled_decoder_s"),
            "itl_late_ms": self.per_token_ms("late_decoder_s"),
            "decoders_per_prefill_s": (
                self.get("stalled_decoder_s") / self.get("prefill_s") if self.get("prefill_s") else None
            ),
            "prefill_s_without_decoders": self.get("prefill_idle_decoders_s"),
            "decoders_at_arrival": self.get("decoders_at_arrival") / arrivals if arrivals else None,
            "queued_at_arrival": self.get("waiting_at_arrival") / arrivals if arrivals else None,
            "cached_at_arrival": self.get("cached_at_arrival"),
            "cached_at_admission": self.get("cached_at_admission"),
            "replica_tpot_mean_ms": (
                1000.0 * self.get("sglang:request_time_per_output_token_seconds_sum") / count if count else None
            ),
            "client_tpot_mean_ms": statistics.fmean(self.client_tpots_ms) if self.client_tpots_ms else None,
            "client_tpot_p50_ms": statistics.median(self.client_tpots_ms) if self.client_tpots_ms else None,
            "client_requests": len(self.client_tpots_ms),
        }


def run_figures(run: Run, deltas: list[dict[str, float]], time_scale: float, urls: list[str]) -> list[ReplicaFigures]:
    """Per replica (``urls``, in the order of ``deltas``), then the cluster as the last entry; client TPOTs by the
    replica that served them when the router says (``x-spillgate-backend``: ``sims/host:port``), else only in the
    cluster's."""
    replicas = [ReplicaFigures(delta) for delta in deltas]
    index_of = {replica_name(url, "sims"): index for index, url in enumerate(urls)}
    total = ReplicaFigures({key: sum(d.get(key, 0.0) for d in deltas) for key in deltas[0]})
    total.delta["now"] = max(d.get("now", 0.0) for d in deltas)
    for result in run.level.results:
        if not result.ok or result.tpot is None:
            continue
        tpot_ms = 1000.0 * result.tpot / time_scale
        total.client_tpots_ms.append(tpot_ms)
        index = index_of.get(result.backend)
        if index is not None and index < len(replicas):
            replicas[index].client_tpots_ms.append(tpot_ms)
    return [*replicas, total]


# Rows and runs --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    kind: str

    def start(self, settings: Settings, cluster: Cluster, router_python: str | None) -> Callable[[Path | None], Relay]:
        def start(trace: Path | None) -> Relay:
            if self.kind == "sglang-router":
                assert router_python is not None
                return start_router(router_python, cluster, "cache_aware")
            policy = self.kind.removeprefix("spillgate-") if self.kind.startswith("spillgate-") else "cache_aware"
            pool = {"belief": BELIEF_POOL, "nohold": NO_HOLD_POOL}.get(self.kind)
            route = {**settings.route, **(STICKY_ROUTE if self.kind == "sticky" else {})}
            return start_spillgate(
                cluster, policy, trace, route, pool=pool, prefix=PREFIX, name=f"spillgate-{self.kind}"
            )

        return start


ROW_KINDS = ("events", "belief", "nohold", "sticky", "sglang-router")


def check_rows(kinds: list[str]) -> None:
    unknown = [kind for kind in kinds if kind not in ROW_KINDS and not kind.startswith("spillgate-")]
    if unknown:
        raise ValueError(f"unknown rows {unknown}; choose from {', '.join(ROW_KINDS)} or spillgate-POLICY")


def measure_run(
    settings: Settings, cluster: Cluster, row: Row, spec: WorkloadSpec, seed: int, router_python: str | None
) -> list[ReplicaFigures]:
    """One run of ``row``: the replicas read once the router is up (its own start-up requests left out) and
    again before it stops."""
    before: list[dict[str, float]] = []
    inner = row.start(settings, cluster, router_python)

    def start(trace: Path | None) -> Relay:
        relay = inner(trace)
        before.extend(read_cluster(cluster))
        return relay

    run = measure(
        settings, cluster, row.kind, "tpot", spec, seed, starter=start, probe=lambda _relay: read_cluster(cluster)
    )
    deltas = [minus(after, early) for after, early in zip(run.probed, before, strict=True)]
    if settings.trace_dir is not None:  # every pass, step and arrival, per replica, for a timeline
        path = settings.trace_dir / f"{row.kind}-tpot-{spec.name}-seed{seed}-passes.jsonl"
        with path.open("w") as out:
            for index, (url, early) in enumerate(zip(cluster.urls, before, strict=True)):
                for record in read_log(url, early["log_seq"]):
                    out.write(json.dumps([index, *record]) + "\n")
    failed = sum(1 for result in run.level.results if not result.ok)
    if failed:
        _progress(f"  {failed} requests failed in {row.kind} seed {seed}")
    return run_figures(run, deltas, settings.time_scale, cluster.urls)


def pool_runs(runs: list[list[ReplicaFigures]]) -> ReplicaFigures:
    """The cluster rows of several runs as one."""
    totals = [figures[-1] for figures in runs]
    delta = {key: sum(t.get(key) for t in totals) for key in totals[0].delta}
    return ReplicaFigures(delta, [tpot for t in totals for tpot in t.client_tpots_ms])


# Report ---------------------------------------------------------------------------------------------------


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


_HEADER = (
    "req", "hit", "new prefill tok", "prefill passes / s", "decode steps / s", "mean batch", "step ms",
    "KV tok/step", "ITL = step + prefill stall + late ms", "decoders per prefill s", "decoders / queued at arrival",
    "cached tok at arrival / admission", "replica TPOT ms", "client TPOT mean / p50 ms",
)  # fmt: skip


def table_row(name: str, fig: ReplicaFigures) -> str:
    j = fig.to_json()
    parts = [j["itl_decode_ms"], j["itl_prefill_stall_ms"], j["itl_late_ms"]]
    itl = "-" if None in parts else f"{_f(sum(parts))} = {_f(parts[0])} + {_f(parts[1])} + {_f(parts[2])}"
    cells = [
        name,
        _f(j["requests"], 0),
        "-" if j["hit"] is None else f"{j['hit']:.1%}",
        _f(j["prefill_tokens"], 0),
        f"{j['prefill_passes']:.0f} / {_f(j['prefill_s'], 2)}",
        f"{j['decode_steps']:.0f} / {_f(j['decode_s'], 2)}",
        _f(j["mean_decode_batch"]),
        _f(j["decode_step_ms"], 2),
        _f(j["kv_tokens_per_step"], 0),
        itl,
        _f(j["decoders_per_prefill_s"]),
        f"{_f(j['decoders_at_arrival'])} / {_f(j['queued_at_arrival'], 2)}",
        f"{j['cached_at_arrival']:,.0f} / {j['cached_at_admission']:,.0f}",
        _f(j["replica_tpot_mean_ms"]),
        f"{_f(j['client_tpot_mean_ms'])} / {_f(j['client_tpot_p50_ms'])}",
    ]
    return "| " + " | ".join(cells) + " |"


def summary(fig: ReplicaFigures) -> str:
    """One run's cluster figures on one line, for the progress log."""
    j = fig.to_json()
    return (
        f"hit {_f(100 * (j['hit'] or 0))}%, ITL {_f(j['itl_decode_ms'])} + {_f(j['itl_prefill_stall_ms'])} + "
        f"{_f(j['itl_late_ms'])} ms, batch {_f(j['mean_decode_batch'])}, decoders/prefill s "
        f"{_f(j['decoders_per_prefill_s'])}, at arrival {_f(j['decoders_at_arrival'])} decoding "
        f"{_f(j['queued_at_arrival'], 2)} queued, cached at arrival {j['cached_at_arrival']:,.0f} tokens, at "
        f"admission {j['cached_at_admission']:,.0f}, {j['prefill_passes']:.0f} prefill passes, TPOT replica "
        f"{_f(j['replica_tpot_mean_ms'])} client {_f(j['client_tpot_mean_ms'])} (p50 {_f(j['client_tpot_p50_ms'])}) ms"
    )


def header(first: str) -> list[str]:
    names = [first, *_HEADER]
    return ["| " + " | ".join(names) + " |", "|" + " --- |" * len(names)]


@dataclass(frozen=True)
class Fit:
    """TPOT against the prefill work of each run: one slope for all rows, an intercept per row (least squares).

    Runs of one row differ in hit rate from seed to seed, and so in the prefill work the replicas did; the
    offset between two rows' intercepts is their TPOT difference at equal prefill work."""

    slope_ms_per_ktok: float
    intercepts_ms: dict[str, float]
    residual_sd_ms: float

    def offset(self, row: str, reference: str) -> float:
        return self.intercepts_ms[row] - self.intercepts_ms[reference]


def fit(points: dict[str, list[tuple[float, float]]]) -> Fit | None:
    """``points``: per row, (new prefill tokens in thousands, TPOT ms) of each run."""
    pooled_var = pooled_cov = 0.0
    means: dict[str, tuple[float, float]] = {}
    for row, xy in points.items():
        if not xy:
            continue
        mx, my = statistics.fmean(x for x, _ in xy), statistics.fmean(y for _, y in xy)
        means[row] = (mx, my)
        pooled_var += sum((x - mx) ** 2 for x, _ in xy)
        pooled_cov += sum((x - mx) * (y - my) for x, y in xy)
    runs = sum(len(xy) for xy in points.values())
    if not pooled_var or runs <= len(means) + 1:
        return None
    slope = pooled_cov / pooled_var
    intercepts = {row: my - slope * mx for row, (mx, my) in means.items()}
    residuals = [y - intercepts[row] - slope * x for row, xy in points.items() for x, y in xy]
    sd = (sum(r * r for r in residuals) / (runs - len(means) - 1)) ** 0.5
    return Fit(slope, intercepts, sd)


def fit_lines(rows: dict[str, list[list[ReplicaFigures]]]) -> list[str]:
    """Each row's TPOT (mean and p50) at equal prefill work, against sglang-router's (or the first row's)."""
    reference = "sglang-router" if "sglang-router" in rows else next(iter(rows))
    lines = []
    for key in ("client_tpot_mean_ms", "client_tpot_p50_ms"):
        points = {
            kind: [
                (figures[-1].get("prefill_tokens") / 1000, figures[-1].to_json()[key])
                for figures in runs
                if figures[-1].to_json()[key] is not None
            ]
            for kind, runs in rows.items()
        }
        found = fit(points)
        if found is None:
            continue
        offsets = ", ".join(
            f"{kind} {found.offset(kind, reference):+.2f} ms" for kind in rows if kind != reference and kind in points
        )
        lines.append(
            f"- {key.removeprefix('client_').replace('_ms', '')}: {found.slope_ms_per_ktok:+.3f} ms per 1,000 new "
            f"prefill tokens a run; at equal prefill work, against {reference}: {offsets or '-'} (residual sd "
            f"{found.residual_sd_ms:.2f} ms)"
        )
    return lines


def render(results: dict[str, dict[str, list[list[ReplicaFigures]]]], seeds: list[int]) -> str:
    lines: list[str] = []
    for workload, rows in results.items():
        lines += [f"## {workload}: cluster, seeds {', '.join(map(str, seeds))} pooled", "", *header("router")]
        lines += [table_row(kind, pool_runs(runs)) for kind, runs in rows.items()]
        lines += ["", "TPOT against the prefill work of each run (one slope, an intercept per router):", ""]
        lines += fit_lines(rows)
        lines.append("")
        for kind, runs in rows.items():
            for seed, figures in zip(seeds, runs, strict=True):
                lines += [f"### {workload}, {kind}, seed {seed}", "", *header("replica")]
                names = [f"{index}" for index in range(len(figures) - 1)] + ["cluster"]
                lines += [table_row(name, fig) for name, fig in zip(names, figures, strict=True)]
                lines.append("")
    lines.append(
        "ITL: the replica's mean time between two tokens of a request, split into the decode steps (time x batch "
        "over tokens), the prefill passes its running requests waited on, and the simulator falling behind its "
        "time scale. decoders per prefill s: running requests kept waiting per second of prefill. decoders / queued at "
        "arrival: what a request found on its replica when it arrived (the router's choice). replica TPOT: "
        "mean per request from its histogram; client TPOT: the same requests as the client measured them."
    )
    return "\n".join(lines)


# Entry point ----------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    kinds = [kind.strip() for kind in args.rows.split(",") if kind.strip()]
    check_rows(kinds)
    seeds = [int(seed) for seed in args.seeds.split(",") if seed.strip()]
    work_dir = Path(tempfile.mkdtemp(prefix="spillgate-tpot-"))
    specs = specs_of(args, work_dir)
    router_python = None
    if "sglang-router" in kinds:
        router_python, note = router_env.router_python()
        if router_python is None:
            raise RuntimeError(f"sglang-router rows asked for but unavailable: {note}")
    settings = Settings(
        replicas=args.replicas,
        time_scale=args.time_scale,
        duration_s=args.duration,
        specs=specs,
        spillgate_policies=["cache_aware"],
        router_policies=["cache_aware"],
        router_python=router_python,
        router_note="",
        work_dir=work_dir,
        trace_dir=Path(args.trace_dir) if args.trace_dir else None,
        repeat=max(seeds) + 1,
    )
    results: dict[str, dict[str, list[list[ReplicaFigures]]]] = {}
    reference = Reference(work_dir)
    reference_up = False
    try:
        for spec in specs:
            if args.kv_tokens is not None:
                kv_tokens = args.kv_tokens
            else:
                if not reference_up:
                    reference.start()
                    reference_up = True
                working, _ = working_set(dataclasses.replace(settings, repeat=2), spec, reference, 2)
                kv_tokens = max(1, round(args.kv_fraction * working / settings.replicas))
                _progress(f"{spec.name}: working set {working:,.0f} tokens, {kv_tokens:,} a replica")
            cluster = start_cluster(settings, work_dir / spec.name, kv_tokens)
            try:
                rows = results.setdefault(spec.name, {})
                for kind in kinds:
                    for seed in seeds:
                        _progress(f"{kind}: {spec.name} seed {seed}")
                        figures = measure_run(settings, cluster, Row(kind), spec, seed, router_python)
                        rows.setdefault(kind, []).append(figures)
                        _progress("  " + summary(figures[-1]))
            finally:
                cluster.stop()
            if args.json:  # what is done so far
                Path(args.json).write_text(json.dumps(as_json(results, seeds), indent=2) + "\n")
    finally:
        reference.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    print(render(results, seeds))
    return 0


def as_json(results: dict[str, dict[str, list[list[ReplicaFigures]]]], seeds: list[int]) -> dict[str, Any]:
    return {
        workload: {
            kind: {str(seed): [fig.to_json() for fig in figures] for seed, figures in zip(seeds, runs, strict=False)}
            for kind, runs in rows.items()
        }
        for workload, rows in results.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="chat", help="chat, gsp, gsp-zipf, trace:PATH")
    parser.add_argument("--rows", default="events,sglang-router", help=f"{', '.join(ROW_KINDS)}, spillgate-POLICY")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--time-scale", type=float, default=6.0)
    parser.add_argument("--duration", type=float, default=4.0, help="simulated seconds of arrivals per run")
    parser.add_argument("--kv-fraction", type=float, default=0.5)
    parser.add_argument("--kv-tokens", type=int, default=None, help="each replica's KV pool, instead of measuring")
    parser.add_argument("--trace-start", type=int, default=-300)
    parser.add_argument("--trace-requests", type=int, default=300)
    parser.add_argument("--trace-block-tokens", type=int, default=64)
    parser.add_argument("--trace-max-output", type=int, default=64)
    parser.add_argument("--trace-speedup", type=float, default=16.0)
    parser.add_argument("--trace-dir", metavar="DIR", help="keep per-request data (see compare_routers)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    return run_script("tpot_breakdown", run, args)


if __name__ == "__main__":
    sys.exit(main())
