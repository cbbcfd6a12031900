"""Spend reads: ``GET /v1/spend`` for the calling tenant, ``GET /admin/spend`` for any tenant (admin key), and
their single requests, ``GET /v1/spend/logs`` and ``GET /admin/spend/logs``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from spillgate.gateway.errors import ApiError
from spillgate.gateway.state import GatewayState
from spillgate.gateway.tenancy.spend_logs import LogFilters, spend_logs
from spillgate.gateway.tenancy.tenants import ANONYMOUS

_HOURS = Query(default=1.0, gt=0, le=24, description="how far back the series goes")
_BUCKET = Query(default=60, ge=60, le=3600, multiple_of=60, description="series bucket width, whole minutes")


def spend_router(state: GatewayState) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/spend")
    async def own_spend(request: Request, hours: float = _HOURS, bucket_s: int = _BUCKET) -> dict[str, Any]:
        """The caller's own spend today and this month, its limits and rate usage, and a recent series.
        There is no parameter naming a tenant: the key decides, so nobody reads another tenant's spend."""
        return await _tenant_report(state, _own_tenant(state, request), hours, bucket_s)

    @router.get("/v1/spend/logs")
    async def own_logs(request: Request, filters: Annotated[LogFilters, Query()]) -> dict[str, Any]:
        """The caller's own requests, newest first, a page at a time; no parameter names a tenant."""
        return await spend_logs(state, _own_tenant(state, request), filters)

    @router.get("/admin/spend")
    async def any_spend(
        request: Request, tenant: str | None = None, hours: float = _HOURS, bucket_s: int = _BUCKET
    ) -> dict[str, Any]:
        """Every tenant's spend (or one tenant's, with its series), for operators."""
        state.tenants.authenticate_admin(request.headers.get("authorization"))
        if tenant is not None:
            return await _tenant_report(state, tenant, hours, bucket_s)
        limits = {name: t.limits for name, t in state.tenants.by_name.items()}
        reports = await state.accountant.spend_all(limits)
        return {"degraded": state.accountant.degraded, "tenants": [r.to_dict() for r in reports]}

    @router.get("/admin/spend/logs")
    async def any_logs(
        request: Request, filters: Annotated[LogFilters, Query()], tenant: str | None = None
    ) -> dict[str, Any]:
        """Every tenant's requests (or one tenant's), newest first, a page at a time, for operators."""
        state.tenants.authenticate_admin(request.headers.get("authorization"))
        return await spend_logs(state, tenant, filters)

    return router


def _own_tenant(state: GatewayState, request: Request) -> str:
    """The tenant of the request's key: the only one its spend endpoints read."""
    tenant = state.tenants.authenticate(request.headers.get("authorization"))
    if tenant.name == ANONYMOUS:
        raise ApiError(401, "Spend is per tenant: pass a tenant key.", code="invalid_api_key")
    return tenant.name


async def _tenant_report(state: GatewayState, name: str, hours: float, bucket_s: int) -> dict[str, Any]:
    known = state.tenants.by_name.get(name)
    if known is None and name not in await state.accountant.tenants():
        raise ApiError(404, f"There is no tenant '{name}'.", param="tenant", code="tenant_not_found")
    limits = known.limits if known is not None else None
    report = await state.accountant.spend(name, limits) if limits else await state.accountant.spend(name)
    series = await state.accountant.series(name, hours=hours, bucket_s=bucket_s)
    return {**report.to_dict(), "series": [point.to_dict() for point in series]}
