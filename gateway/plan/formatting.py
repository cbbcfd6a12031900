"""How plan figures are written for people, shared by the table and the error and warning messages."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from spillgate.gateway.plan.inputs import GB


def num(value: float) -> str:
    """Thousands separators; whole numbers without decimals, others with one."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def sig(value: float) -> str:
    """Three significant digits, no trailing zeros: 3.8, 1.34, 65, 0.05, so the shown division adds up."""
    digits = max(0, 2 - math.floor(math.log10(abs(value)))) if value else 0
    text = f"{value:,.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def gb(value: float) -> str:
    return f"{value / GB:,.1f} GB"


def pct(value: float) -> str:
    return f"{100 * value:g}%"


def ms(value: Any) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.0f} ms"


def usd(value: float) -> str:
    return f"${value:,.0f}" if value >= 100 else f"${value:,.2f}"


def ratio(value: float) -> str:
    """1/3 rather than 0.333333 where a small fraction says it exactly."""
    fraction = Fraction(value).limit_denominator(12)
    return f"{fraction}" if abs(float(fraction) - value) < 1e-9 and fraction.denominator > 1 else f"{value:g}"


def byte_size(value: float) -> str:
    return f"{value:g} B" if value < 1024 else f"{value / 1024:,.4g} KiB"
