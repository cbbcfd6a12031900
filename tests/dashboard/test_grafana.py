"""The Grafana dashboard and the Prometheus scrape example: valid, and every series the dashboard queries is
one a real gateway with traffic exposes on ``/metrics``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.dashboard import promtext
from tests.dashboard.conftest import Stack

CONFIG = Path(__file__).resolve().parents[2] / "config"
DASHBOARD = CONFIG / "grafana" / "spillgate.json"
METRIC = re.compile(r"\bspillgate_[a-zA-Z0-9_]+")
GRAFANA_VARIABLES = re.compile(r"\$(__rate_interval|__range|backend)\b")
PAIRS = {"(": ")", "[": "]", "{": "}"}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def queries(board: dict[str, Any]) -> list[str]:
    """Every PromQL expression: the panels' targets and the template variables' queries."""
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs


def balanced(expr: str) -> bool:
    stack: list[str] = []
    for char in re.sub(r'"[^"]*"', '""', expr):  # brackets inside label matchers' strings do not count
        if char in PAIRS:
            stack.append(PAIRS[char])
        elif char in PAIRS.values() and (not stack or stack.pop() != char):
            return False
    return not stack


def test_dashboard_json_is_complete() -> None:
    board = dashboard()
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    assert len(panels) >= 10
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and {"x", "y", "w", "h"} <= panel["gridPos"].keys(), panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            expr = target["expr"]
            assert balanced(expr), expr
            assert "$" not in GRAFANA_VARIABLES.sub("", expr), f"unknown variable in {expr}"


def test_every_panel_of_the_issue_is_there() -> None:
    text = " ".join(queries(dashboard()))
    for needed in (
        "sum by (tenant, kind) (rate(spillgate_spend_usd_total",
        "spillgate_hosted_equivalent_usd_total",
        "histogram_quantile(0.99, sum by (le, backend) (rate(spillgate_ttft_seconds_bucket",
        "histogram_quantile(0.5, sum by (le, backend) (rate(spillgate_tpot_seconds_bucket",
        "sum by (reason) (rate(spillgate_requests_total",
        'spillgate_prompt_tokens_total{kind="cached"',
        'spillgate_slo_requests_total{result="met"}',
        "spillgate_backend_kv_usage_ratio",
        "spillgate_backend_queued_requests",
        "spillgate_backend_in_flight",
    ):
        assert needed in text, needed


def test_every_queried_series_exists_on_a_live_gateway(stack: Stack) -> None:
    exposed = set(promtext.parse(stack.metrics()))
    referenced = {name for expr in queries(dashboard()) for name in METRIC.findall(expr)}
    assert referenced, "the dashboard queries no spillgate_* series"
    missing = sorted(referenced - exposed)
    assert not missing, f"queried but not on /metrics: {missing}; exposed: {sorted(exposed)}"


def test_prometheus_example_scrapes_the_gateway() -> None:
    config = yaml.safe_load((CONFIG / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    gateway = jobs["spillgate"]
    assert gateway["metrics_path"] == "/metrics"
    assert gateway["static_configs"][0]["targets"] == ["127.0.0.1:8080"]  # the demo's listen address
    demo = yaml.safe_load((CONFIG / "demo.yaml").read_text())
    assert gateway["authorization"]["credentials"] == demo["metrics"]["token"]  # the demo's /metrics needs it
