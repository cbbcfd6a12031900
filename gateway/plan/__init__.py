"""``spillgate plan``, the GPU capacity planner: inputs, arithmetic, bench reading, output and the command.

``gateway.cli`` wires the command in through ``add_arguments``; the rest is here for scripts that plan in Python.
"""

from spillgate.gateway.plan.bench_report import point_from_bench
from spillgate.gateway.plan.command import add_arguments, inputs_from_args, run
from spillgate.gateway.plan.estimate import compute_plan
from spillgate.gateway.plan.inputs import PlanError, PlanInputs
from spillgate.gateway.plan.render import format_table, to_json
from spillgate.gateway.plan.results import Plan

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
