"""Per-minute rate limits as GCRA: one number per tenant and limit, the theoretical arrival time (TAT).

A limit of L per minute spaces units T = 60/L seconds apart and allows a burst of one full minute's worth:
a request of ``cost`` units is admitted when ``max(tat, now) + cost*T - 60 <= now``. Unlike a window
log it keeps O(1) state (one Redis hash field), gives an exact ``retry_after``, and a refund (tokens
settled below what was reserved) is one subtraction. The Lua scripts in :mod:`.scripts` mirror this.
"""

from __future__ import annotations

from .limits import WINDOW_S

_SLACK_S = 1e-6
"""Float rounding must not refuse the L-th request of a minute."""

NEVER = -1.0


def charge(tat: float, now: float, cost: int, limit: int) -> tuple[float, float]:
    """``(new_tat, 0)`` when admitted, else ``(tat, retry_after_s)``; ``retry_after_s == NEVER`` when
    ``cost`` alone exceeds the limit."""
    if cost > limit:
        return tat, NEVER
    new_tat = max(tat, now) + cost * WINDOW_S / limit
    wait = new_tat - WINDOW_S - now
    if wait > _SLACK_S:
        return tat, wait
    return new_tat, 0.0


def refund(tat: float, now: float, amount: int, limit: int) -> float:
    """Give back ``amount`` units (negative: charge more, never refused); a full bucket stays full."""
    if amount < 0:
        return max(tat, now) - amount * WINDOW_S / limit
    return max(tat - amount * WINDOW_S / limit, now)


def used(tat: float, now: float, limit: int) -> float:
    """Units the last minute has consumed, as the limit sees it."""
    return max(0.0, tat - now) * limit / WINDOW_S
