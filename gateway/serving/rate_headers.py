"""OpenAI's rate-limit headers, for the answers of a tenant with per-minute limits.

``x-ratelimit-limit-requests``, ``-remaining-requests`` and ``-reset-requests``, and the same for ``-tokens``, as
OpenAI sends them, so clients that pace themselves on them (the OpenAI SDK's users, LangChain's limiters) work
unchanged. They describe the tenant's limits after this request was charged: its worst case in tokens (prompt plus
``max_tokens``) until it settles. The reset is how long until nothing of the minute's allowance is in use.
"""

from __future__ import annotations

import math

from spillgate.gateway.accounting.limits import WINDOW_S
from spillgate.gateway.accounting.report import RateUsage

Headers = tuple[tuple[bytes, bytes], ...]


def rate_limit_headers(usage: RateUsage) -> Headers:
    """The headers for the limits the tenant has; ``()`` for none."""
    headers: list[tuple[bytes, bytes]] = []
    if usage.requests_per_minute is not None and usage.requests_used is not None:
        headers += _one_limit(b"requests", usage.requests_per_minute, usage.requests_used)
    if usage.tokens_per_minute is not None and usage.tokens_used is not None:
        headers += _one_limit(b"tokens", usage.tokens_per_minute, usage.tokens_used)
    return tuple(headers)


def _one_limit(kind: bytes, limit: int, used: float) -> list[tuple[bytes, bytes]]:
    remaining = max(0, math.floor(limit - used + 1e-9))
    return [
        (b"x-ratelimit-limit-" + kind, str(limit).encode()),
        (b"x-ratelimit-remaining-" + kind, str(remaining).encode()),
        (b"x-ratelimit-reset-" + kind, duration(used * WINDOW_S / limit).encode()),
    ]


def duration(seconds: float) -> str:
    """A duration the way OpenAI writes it: ``0s``, ``250ms``, ``8.64s``, ``1m30s``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    minutes, rest = divmod(round(seconds, 3), 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text
