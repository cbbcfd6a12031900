"""A config is plain data: what JSON can hold, and nothing else YAML can build.

YAML's tags make bytes (``!!binary``), sets (``!!set``), dates (``!!timestamp``, or an unquoted ``2026-01-01``),
non-string keys and non-finite floats. None of them means anything in a config, and each would fail later, far
from its line (a version is stored as JSON), so they are refused up front, each by its field path.
"""

from __future__ import annotations

import math
from typing import Any

_SCALARS = (str, bool, int, type(None))


def non_json_problems(value: Any, path: str = "") -> list[tuple[str, str]]:
    """Every place in ``value`` JSON cannot hold, as (field path, message)."""
    where = path or "(top level)"
    if isinstance(value, _SCALARS):
        return []
    if isinstance(value, float):
        return [] if math.isfinite(value) else [(where, f"{value} is not a finite number")]
    if isinstance(value, list):
        problems: list[tuple[str, str]] = []
        for index, item in enumerate(value):
            problems += non_json_problems(item, f"{path}.{index}" if path else str(index))
        return problems
    if isinstance(value, dict):
        problems = []
        for key, item in value.items():
            if not isinstance(key, str):
                problems.append((where, f"key {key!r} is a {type(key).__name__}: keys must be strings"))
                continue
            problems += non_json_problems(item, f"{path}.{key}" if path else key)
        return problems
    kind = type(value).__name__
    return [(where, f"a {kind} is not a config value: use a string, number, boolean, list or mapping (quote it)")]
