"""The operator dashboard at ``/dashboard``: spend, savings, latencies, spills and replica load.

The page and its assets are package files served by the gateway itself (no CDN, nothing fetched from
elsewhere); the data endpoint needs an admin or a tenant key and scopes what it returns to the caller."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from spillgate.gateway.errors import ApiError
from spillgate.gateway.observability.dashboard.assets import asset_response
from spillgate.gateway.observability.dashboard.data import dashboard_data
from spillgate.gateway.state import GatewayState

MAX_POINTS = 1440
"""Buckets one response may hold: a day by the minute."""


def dashboard_router(state: GatewayState) -> APIRouter:
    """Routes of the dashboard page, its assets and its data."""
    router = APIRouter()

    @router.get("/dashboard", include_in_schema=False)
    async def page() -> Response:
        return asset_response("index.html")

    @router.get("/dashboard/static/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        return asset_response(name)

    @router.get("/dashboard/api/data")
    async def data(
        request: Request,
        window_s: int = Query(3600, ge=60, le=31 * 86400),
        bucket_s: int = Query(60, ge=60, le=86400, multiple_of=60, description="whole minutes, as the ledger keeps"),
    ) -> Response:
        """What the dashboard draws, for the caller's key: an admin's covers every tenant, a tenant's its own."""
        viewer = state.tenants.authenticate_any(request.headers.get("authorization"))
        if window_s / bucket_s > MAX_POINTS:
            raise ApiError(422, f"window_s / bucket_s must be at most {MAX_POINTS}", param="bucket_s")
        body = await dashboard_data(state, viewer, window_s=window_s, bucket_s=bucket_s)
        return Response(
            orjson.dumps(body),
            media_type="application/json",
            headers={"cache-control": "no-store", "x-content-type-options": "nosniff"},
        )

    return router
