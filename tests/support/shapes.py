"""The shape of a JSON value (key names, value types, null or not), to hold one server's answers to another's."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families


def shape(value: Any) -> Any:
    """Names and types, not values: a dict's keys with their shapes, a list's first element, a scalar's type."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if value is None:
        return "null"
    return type(value).__name__


def differences(real: Any, sim: Any, path: str = "") -> list[str]:
    """Where ``sim`` differs from ``real`` in shape, one line each (an empty list: the same)."""
    real_shape, sim_shape = shape(real), shape(sim)
    return _diff(real_shape, sim_shape, path or "$")


def _diff(real: Any, sim: Any, path: str) -> list[str]:
    if isinstance(real, dict) and isinstance(sim, dict):
        found = [f"{path}.{key}: missing in the simulator" for key in real if key not in sim]
        found += [f"{path}.{key}: the real server has no such field" for key in sim if key not in real]
        for key in real.keys() & sim.keys():
            found += _diff(real[key], sim[key], f"{path}.{key}")
        return found
    if isinstance(real, list) and isinstance(sim, list):
        if real and sim:
            return _diff(real[0], sim[0], f"{path}[0]")
        return []
    if real != sim and not (real == "float" and sim == "int") and not (real == "int" and sim == "float"):
        return [f"{path}: real {real}, simulator {sim}"]
    return []


def metric_families(text: str, prefix: str) -> dict[str, tuple[str, frozenset[str]]]:
    """Each metric family named ``prefix...`` that has samples: its type and the label names of its samples. (A
    labelled family nothing has observed yet shows only its HELP and TYPE lines; prometheus_client's parser
    yields those as an empty family from 0.26 on, and skipped them before.)"""
    families = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith(prefix) and family.samples:
            labels = frozenset(name for sample in family.samples for name in sample.labels if name != "le")
            families[family.name] = (family.type, labels)
    return families
