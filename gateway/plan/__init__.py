"""``spillgate plan``, the GPU capacity planner: inputs, arithmetic, bench reading, output and the command.

``gateway.cli`` wires the command in through ``add_arguments``; the rest is here for scripts that plan in Python.
"""

from gateway.plan.bench_report import point_from_bench
from gateway.plan.command import add_arguments, inputs_from_args, run
from gateway.plan.estimate import compute_plan
from gateway.plan.inputs import PlanError, PlanInputs
from gateway.plan.render import format_table, to_json
from gateway.plan.results import Plan

__all__ = [
    "Plan",
    "PlanError",
    "PlanInputs",
    "add_arguments",
    "compute_plan",
    "format_table",
    "inputs_from_args",
    "point_from_bench",
    "run",
    "to_json",
]
