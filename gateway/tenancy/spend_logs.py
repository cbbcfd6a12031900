"""Per-request spend, read from the ledger: what ``GET /v1/spend/logs`` and ``GET /admin/spend/logs`` return.

The caller's scope is decided by the route (a tenant key reads its own tenant only); this module turns query
parameters into a :class:`~gateway.accounting.logs.LogQuery`, refusing bad ones in OpenAI's error format."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from spillgate.gateway.accounting.logs import DEFAULT_LIMIT, MAX_LIMIT, BadCursor, LogQuery, ReadTooSlow
from spillgate.gateway.errors import ApiError
from spillgate.gateway.state import GatewayState


class LogFilters(BaseModel):
    """The query parameters both spend-log endpoints take (``Annotated[LogFilters, Query()]``). The tenant is not
    among them: a tenant key reads its own, and only the admin endpoint takes a ``tenant``. Times stay text until
    :func:`spend_logs` reads them, so a caller without a valid key is told that first."""

    route: str | None = None
    user: str | None = None
    since: str | None = Field(
        default=None, description="oldest time included: unix seconds or ISO-8601 (UTC unless it says)"
    )
    until: str | None = Field(
        default=None, description="first time excluded: unix seconds or ISO-8601 (UTC unless it says)"
    )
    limit: int = Field(default=DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description="rows per page")
    cursor: str | None = Field(default=None, description="the previous page's next_cursor")


def parse_time(value: str | None, param: str) -> float | None:
    """``value`` as unix seconds: a number of them, or an ISO-8601 date or time (UTC when it names no zone)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            moment = datetime.fromisoformat(value)
            return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()
        except (ValueError, OverflowError):  # not ISO-8601, or out of the calendar's range once in UTC
            raise _bad_time(value, param) from None
    if not math.isfinite(seconds) or seconds < 0:
        raise _bad_time(value, param)
    return seconds


def _bad_time(value: str, param: str) -> ApiError:
    return ApiError(
        422,
        f"'{param}' is {value!r}: give unix seconds (1733220000) or an ISO-8601 time (2024-12-03T10:00:00Z).",
        param=param,
        code="invalid_value",
    )


async def spend_logs(state: GatewayState, tenant: str | None, filters: LogFilters) -> dict[str, Any]:
    """One page of the ledger's entries (``tenant``'s, or every tenant's for ``None``), newest first, as
    ``{"object": "list", "data", "has_more", "next_cursor"}``."""
    start, end = parse_time(filters.since, "since"), parse_time(filters.until, "until")
    if start is not None and end is not None and start >= end:
        raise ApiError(422, "'since' must be before 'until'.", param="since", code="invalid_value")
    route = filters.route
    known = state.routes.get(route) if route is not None else None
    query = LogQuery(
        tenant=tenant,
        route=known.name if known is not None else route,  # an alias reads its route; a removed route its name
        user=filters.user,
        since=start,
        until=end,
        limit=filters.limit,
        cursor=filters.cursor,
    )
    try:
        page = await state.accountant.ledger.logs(query)
    except BadCursor:
        raise ApiError(
            422,
            "'cursor' is not one this gateway wrote: pass a page's next_cursor.",
            param="cursor",
            code="invalid_value",
        ) from None
    except ReadTooSlow:
        raise ApiError(
            503,
            "Reading the ledger took too long for these filters: narrow them with 'since' and 'until'.",
            code="ledger_read_timeout",
        ) from None
    return page.to_dict()
