"""Argparse ``type=`` functions for ``spillgate plan``: a bad value is refused while parsing, naming its flag."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from fractions import Fraction
from typing import TypeVar

T = TypeVar("T", int, float)


def _parse(to_number: Callable[[str], T], value: str, expected: str) -> T:
    try:
        return to_number(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{expected}, got {value!r}") from None


def _require(ok: bool, value: str, rule: str) -> None:
    """One wording for every refusal: the rule, then the value as typed."""
    if not ok:
        raise argparse.ArgumentTypeError(f"{rule}, got {value!r}")


def _bounded(parse: Callable[[str], T], ok: Callable[[T], bool], rule: str) -> Callable[[str], T]:
    """A ``type=`` that parses with ``parse`` and refuses a value failing ``ok``, so each bound is one line."""

    def convert(value: str) -> T:
        number = parse(value)
        _require(ok(number), value, rule)
        return number

    return convert


def whole_number(value: str) -> int:
    return _parse(int, value, "expected a whole number")


def finite_number(value: str) -> float:
    number = _parse(float, value, "expected a number")
    _require(math.isfinite(number), value, "expected a finite number")
    return number


non_negative_int: Callable[[str], int] = _bounded(whole_number, lambda number: number >= 0, "must not be negative")
positive_int: Callable[[str], int] = _bounded(non_negative_int, lambda number: number >= 1, "must be at least 1")
positive: Callable[[str], float] = _bounded(finite_number, lambda number: number > 0, "must be positive")
non_negative: Callable[[str], float] = _bounded(finite_number, lambda number: number >= 0, "must not be negative")


def fraction(value: str) -> float:
    """``0.3``, ``30%`` or ``1/3``: a ratio written the way it was thought of."""
    text = value.strip()
    try:
        if text.endswith("%"):
            return float(Fraction(text[:-1].strip()) / 100)
        return float(Fraction(text))
    except (ValueError, ZeroDivisionError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected a fraction like 0.3, 30% or 1/3, got {value!r}") from None


def param_count(value: str) -> float:
    """A parameter count: ``70B``, ``8e9``, ``1.5T``."""
    text = value.strip().upper()
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}.get(text[-1:], 1.0)
    number = positive(text[:-1] if scale != 1.0 else text) * scale
    _require(math.isfinite(number), value, "expected a finite count")
    return number
