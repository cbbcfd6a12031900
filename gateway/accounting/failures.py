"""Requests that did not end well, counted per time bucket and outcome from the ledger: the dashboard's errors
over time, per tenant, surviving restarts.

A partial index holds only the entries whose outcome is not ``ok``, so the count reads the failures alone,
however many requests succeeded around them."""

from __future__ import annotations

from pathlib import Path

from .logs import read

FailureRow = tuple[int, str, str, int]
"""Bucket start (unix seconds), tenant, outcome, requests."""

_COUNT = """
SELECT CAST(time / ? AS INTEGER) * ? AS bucket, tenant, outcome, COUNT(*) FROM entries INDEXED BY entries_failed
WHERE outcome != 'ok' AND time >= ?{tenant} GROUP BY bucket, tenant, outcome ORDER BY bucket, tenant, outcome"""


def read_failures(path: Path, since: float, bucket_s: int, tenant: str | None) -> list[FailureRow]:
    """Entries not ``ok`` since ``since``, per ``bucket_s`` bucket, tenant and outcome (one tenant's, or every
    one's).
    Blocking: run it on a thread."""
    params: list[object] = [bucket_s, bucket_s, since]
    if tenant is not None:
        params.append(tenant)
    return read(path, _COUNT.format(tenant=" AND tenant = ?" if tenant is not None else ""), params)
