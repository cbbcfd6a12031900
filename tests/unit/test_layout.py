"""The code's shape, checked: no import cycle, the layers import downwards, and each piece of load state is written
by its one owner. Read from the source (``ast``), so a violation fails here before it confuses a reader."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

from spillgate.backends.load import OwnLoad, PeersLoad
from spillgate.policies.types import BackendKind

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "policies", "backends", "cache")
KINDS = get_args(BackendKind)


def runtime_modules() -> dict[str, Path]:
    """Every module that installs, by its dotted name under ``spillgate``."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules["spillgate." + ".".join(parts)] = path
    return modules


def imported(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``path`` imports, anywhere in it (type-checking and function-level imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from package import submodule`` needs the submodule; any other name comes from the module itself.
            submodules = [f"{node.module}.{alias.name}" for alias in node.names]
            names = [name if name in modules else node.module for name in submodules]
        found.update(name for name in names if name in modules)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = runtime_modules()
    return {name: imported(path, modules) - {name} for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_round_a_circle() -> None:
    assert cycles(import_graph()) == []


def test_cycles_are_found_when_there_are_some() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_prefix_state_and_policies_import_nothing_from_the_gateway() -> None:
    graph = import_graph()
    upward = {
        (name, target)
        for name, targets in graph.items()
        if name.startswith(("spillgate.cache", "spillgate.policies", "spillgate.backends"))
        for target in targets
        if target.startswith("spillgate.gateway")
    }
    assert upward == set()


def test_the_simulator_is_kept_apart_from_the_code_that_talks_to_real_engines() -> None:
    """Only the command line (``spillgate sim-replica``, ``sim-hosted``) reaches into the simulator."""
    importers = {
        name
        for name, targets in import_graph().items()
        if not name.startswith("spillgate.backends.sim")
        and any(target.startswith("spillgate.backends.sim") for target in targets)
    }
    assert importers == {"spillgate.gateway.cli"}


def assignments(path: Path) -> Iterator[tuple[str, str, int]]:
    """``(owner expression, attribute, line)`` of every assignment to an attribute in ``path``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(element, ast.Attribute):
                        yield ast.unparse(element.value), element.attr, node.lineno


def writers(record: str, fields: tuple[str, ...]) -> set[str]:
    """Files that assign to ``fields`` of an object reached as ``...<record>`` (``backend.own``, ``own``)."""
    found = set()
    for path in runtime_modules().values():
        for owner, attribute, _ in assignments(path):
            if attribute in fields and (owner == record or owner.endswith("." + record)):
                found.add(str(path.relative_to(ROOT)))
    return found


def test_this_process_load_has_one_writer_the_dispatch_ticket() -> None:
    assert writers("own", tuple(OwnLoad.__dataclass_fields__)) == {"gateway/dispatch/ticket.py"}


def test_other_processes_load_has_one_writer_the_peer_exchange() -> None:
    assert writers("peers", tuple(PeersLoad.__dataclass_fields__)) == {"gateway/dispatch/peer_load.py"}


def test_the_serving_path_asks_no_backend_its_kind() -> None:
    """Forwarding dispatches through the upstream interface; only the table of upstreams names the kinds."""
    asked = []
    for path in sorted([*(ROOT / "gateway" / "serving").glob("*.py"), ROOT / "gateway" / "dispatch" / "ticket.py"]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                isinstance(side, ast.Constant) and side.value in KINDS for side in [node.left, *node.comparators]
            ):
                asked.append(f"{path.name}:{node.lineno}")
    assert asked == []


def test_every_package_installs_under_spillgate_and_nothing_else_does() -> None:
    """``pip install .`` puts exactly these packages into site-packages: a folder missing from the list would be
    left out of a wheel, and nothing claims a generic top-level name (``gateway``, ``cache``...)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    on_disk = {name for name, path in runtime_modules().items() if path.name == "__init__.py"} | {"spillgate.config"}
    assert listed == on_disk
    assert setuptools["package-dir"] == {f"spillgate.{folder}": folder for folder in (*PACKAGES, "config")}
