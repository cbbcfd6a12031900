"""The benchmark's output: the machine it ran on, and one markdown row per target with the goals checked."""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tests.bench.core_load import NOISY_PERCENT

Row = Mapping[str, Any]


@dataclass(frozen=True)
class Goal:
    """A target the gateway must meet; ``value`` reads the figure from a measured row."""

    label: str
    value: Callable[[Row], float]
    limit: float
    at_most: bool

    def met(self, row: Row) -> bool:
        value = self.value(row)
        return not math.isnan(value) and (value <= self.limit if self.at_most else value >= self.limit)


GOALS = (
    Goal("added p50 <= 1 ms", lambda r: r["added"]["p50_ms"], 1.0, at_most=True),
    Goal(">= 2,500 non-streaming req/s", lambda r: r["nonstream"]["per_second"], 2500.0, at_most=False),
    Goal(">= 1,500 streams/s", lambda r: r["stream"]["per_second"], 1500.0, at_most=False),
    Goal("added TTFB p99 <= 2 ms", lambda r: r["added"]["ttfb_p99_ms"], 2.0, at_most=True),
)


def goals_met(row: Row) -> dict[str, bool]:
    return {goal.label: goal.met(row) for goal in GOALS}


def machine_info() -> dict[str, Any]:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), model)
    except OSError:
        pass
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _ms(value: float, signed: bool = False) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def _pair(a: float, b: float, signed: bool = False) -> str:
    return f"{_ms(a, signed)} / {_ms(b, signed)}"


def _rate(value: float) -> str:
    return f"{value:,.0f}"


HEADER = (
    "| target | latency p50 / p99 ms (1 conn) | added p50 / p99 ms | req/s (64 conns) | streams/s (32 conns) "
    "| TTFB p50 / p99 ms (32 conns @ {rate:,.0f}/s) | added TTFB p50 / p99 ms | goals met "
    "| other work on the cores (max) |"
)


def markdown_table(rows: Mapping[str, Row], *, paced_rate: float) -> str:
    lines = [HEADER.format(rate=paced_rate), "|" + " --- |" * 9]
    for name, row in rows.items():
        if "skipped" in row:
            lines.append(f"| {name} | skipped: {row['skipped']} |" + " |" * 7)
            continue
        latency, ttfb, added = row["latency"], row["ttfb"], row.get("added")
        ttfb_cell = _pair(ttfb["ttfb_p50_ms"], ttfb["ttfb_p99_ms"])
        if ttfb["per_second"] < 0.95 * paced_rate:
            ttfb_cell += f" (kept up only {ttfb['per_second']:,.0f}/s)"
        if added is None:
            added_cells, goals_cell = "-", "-"
            added_ttfb = "-"
        else:
            added_cells = _pair(added["p50_ms"], added["p99_ms"], signed=True)
            added_ttfb = _pair(added["ttfb_p50_ms"], added["ttfb_p99_ms"], signed=True)
            met = goals_met(row)
            missed = [label for label, ok in met.items() if not ok]
            goals_cell = f"{len(met) - len(missed)}/{len(met)}" + (f" (missed: {'; '.join(missed)})" if missed else "")
        cells = [
            name,
            _pair(latency["p50_ms"], latency["p99_ms"]),
            added_cells,
            _rate(row["nonstream"]["per_second"]),
            _rate(row["stream"]["per_second"]),
            ttfb_cell,
            added_ttfb,
            goals_cell,
            f"{max(_foreign(row, key) for key in FIGURES):g}%",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


FIGURES = ("latency", "nonstream", "stream", "ttfb")


def problems(rows: Mapping[str, Row]) -> list[str]:
    """Errors, and other processes on the relay's core: a figure from such a run is not to be trusted."""
    found = []
    for name, row in rows.items():
        if "skipped" in row:
            continue
        noisy = [f"{key} {_foreign(row, key):g}%" for key in FIGURES if _foreign(row, key) > NOISY_PERCENT]
        if noisy:
            found.append(f"{name}: other processes used a benchmark core ({', '.join(noisy)}): rerun when idle")
        for key in ("latency", "ttfb"):
            if row[key]["errors"]:
                found.append(f"{name}: {row[key]['errors']} failed requests in the {key} run")
        for key in ("nonstream", "stream"):
            bad = row[key]["non_2xx"] + row[key]["socket_errors"]
            if bad:
                found.append(f"{name}: wrk {key}: {row[key]['non_2xx']} non-2xx, {row[key]['socket_errors']} errors")
    return found


def _foreign(row: Row, key: str) -> float:
    """The larger share of the relay's or the clients' core that other processes took during a figure."""
    return max(row[key].get("foreign_cpu_pct", {}).values(), default=0.0)


def render(machine: Row, loads: Row, settings: Row, rows: Mapping[str, Row]) -> str:
    """The whole printed report: machine, settings, goals, the table and any warnings."""
    lines = [
        "",
        f"Machine: {machine['nproc']} cores ({machine['cpu_model']}), Python {machine['python']}, "
        f"kernel {machine['kernel']}; load average {loads['before']} before, {loads['after']} after",
        f"Relays pinned to core {settings['server_cpu']}; stub, wrk and loadgen on core {settings['client_cpu']}; "
        f"{settings['seconds']:g} s per figure after {settings['warmup_s']:g} s warm-up",
        "Goals: " + "; ".join(goal.label for goal in GOALS),
        "",
        markdown_table(rows, paced_rate=settings["paced_rate"]),
    ]
    warnings = problems(rows)
    if warnings:
        lines += ["", *(f"warning: {warning}" for warning in warnings)]
    return "\n".join(lines)


def as_json(machine: Row, loads: Row, settings: Row, rows: Mapping[str, Row]) -> dict[str, Any]:
    return {
        "machine": machine,
        "load_average": loads,
        "settings": settings,
        "goals": [goal.label for goal in GOALS],
        "rows": rows,
        "goals_met": {name: goals_met(row) for name, row in rows.items() if "added" in row},
    }
