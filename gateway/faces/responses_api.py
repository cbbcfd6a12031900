"""``GET`` and ``DELETE /v1/responses/{id}``: a tenant's stored responses (``client.responses.retrieve``/``delete``).

The key decides whose store is read: an id stored by another tenant is answered 404 like one never stored.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request

from spillgate.gateway.errors import ApiError
from spillgate.gateway.faces.response_store import StoreUnavailable
from spillgate.gateway.faces.response_store_choice import stores_for
from spillgate.gateway.state import GatewayState

log = logging.getLogger("spillgate.responses")


def responses_router(state: GatewayState) -> APIRouter:
    router = APIRouter()
    stores = stores_for(state)

    @router.get("/responses/{response_id}", include_in_schema=False)
    @router.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, request: Request) -> dict[str, Any]:
        """A response this tenant stored (``store`` was not false), until it expires or is deleted."""
        tenant = state.tenants.authenticate(request.headers.get("authorization"))
        try:
            stored = await stores.current().get(tenant.name, response_id)
        except StoreUnavailable as exc:
            raise _unavailable(exc) from None
        if stored is None:
            raise _not_found(response_id)
        return stored.response

    @router.delete("/responses/{response_id}", include_in_schema=False)
    @router.delete("/v1/responses/{response_id}")
    async def delete(response_id: str, request: Request) -> dict[str, Any]:
        """Forget a stored response: it can no longer be retrieved or chained to."""
        tenant = state.tenants.authenticate(request.headers.get("authorization"))
        try:
            deleted = await stores.current().delete(tenant.name, response_id)
        except StoreUnavailable as exc:
            raise _unavailable(exc) from None
        if not deleted:
            raise _not_found(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    return router


def _not_found(response_id: str) -> ApiError:
    return ApiError(404, f"Response with id '{response_id}' not found.", code="response_not_found")


def _unavailable(exc: StoreUnavailable) -> ApiError:
    log.warning("stored responses unreachable: %s", exc)
    return ApiError(
        503,
        "Stored responses are unreachable right now; retry shortly.",
        code="response_store_unavailable",
        headers={"retry-after": "1"},
    )
