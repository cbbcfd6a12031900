"""Managed tenant keys: ``/admin/keys`` to create, list, rotate and revoke them (admin key only).

A key is shown once, in the answer that makes it; afterwards only its id, its first characters and its settings
are. What it may do is its tenant's (the config's), and within limits of its own when it has them."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from spillgate.gateway.control.secrets import resolve_secret
from spillgate.gateway.errors import ApiError
from spillgate.gateway.state import GatewayState
from spillgate.gateway.tenancy.managed_keys import KeyLimits, KeyStoreUnavailable, ManagedKey
from spillgate.gateway.tenancy.managed_keys_service import ManagedKeys, UnknownKey

_LATEST = 253_402_300_799.0
"""9999-12-31T23:59:59Z: the latest expiry taken."""


class _Limits(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    requests_per_minute: int | None = Field(default=None, ge=1, le=10**9)
    tokens_per_minute: int | None = Field(default=None, ge=1, le=10**12)


class _Budget(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    usd_per_day: float | None = Field(default=None, ge=0, le=1e9)
    usd_per_month: float | None = Field(default=None, ge=0, le=1e9)


class NewKey(BaseModel):
    """``POST /admin/keys``: whose key, what to call it, when it expires, and its own limits."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    tenant: str = Field(min_length=1)
    name: str | None = Field(default=None, max_length=200)
    expires_at: float | str | None = Field(default=None, description="unix seconds or ISO-8601 (UTC if no zone)")
    expires_in_s: float | None = Field(default=None, gt=0, le=_LATEST - 2e9)
    limits: _Limits | None = None
    budget: _Budget | None = None


class Rotation(BaseModel):
    """``POST /admin/keys/{id}/rotate``: how long the old key keeps working beside the new one."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    grace_s: float = Field(default=0.0, ge=0, le=30 * 86_400)


def keys_router(state: GatewayState) -> APIRouter:
    held: list[ManagedKeys] = []

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        settings = state.config.state
        url = resolve_secret(settings.redis_url) if settings.redis_url else None
        keys = ManagedKeys(
            state.data_dir,
            redis_url=url,
            key_prefix=settings.key_prefix,
            fail_open=settings.on_redis_outage != "fail_closed",
        )
        await keys.start()
        state.tenants.managed = keys
        held.append(keys)
        try:
            yield
        finally:
            held.clear()
            await keys.stop()

    router = APIRouter(prefix="/admin", lifespan=lifespan)

    def admin(request: Request) -> ManagedKeys:
        state.tenants.authenticate_admin(request.headers.get("authorization"))
        if not held:
            raise ApiError(503, "Managed keys are not loaded yet.", code="key_store_unavailable")
        return held[0]

    @router.post("/keys", status_code=201)
    async def create_key(request: Request, body: NewKey) -> JSONResponse:
        """A new key for ``tenant``; the answer is the only place the key is ever shown."""
        keys = admin(request)
        if body.tenant not in state.tenants.by_name:
            known = ", ".join(sorted(state.tenants.by_name)) or "none"
            raise ApiError(
                404, f"There is no tenant '{body.tenant}' (tenants: {known}).", param="tenant", code="tenant_not_found"
            )
        now = time.time()
        expires_at = _expiry(body, now)
        limits = _key_limits(body)
        for _ in range(3):
            try:
                secret, record = await keys.create(
                    body.tenant, now, name=body.name, expires_at=expires_at, limits=limits
                )
            except KeyStoreUnavailable:
                raise _store_down() from None
            if not state.tenants.config_key(record.digest):
                break
            await keys.revoke(record.id, now)  # astronomically unlikely: it equals a key of the config file
        return JSONResponse({**record.public(now), "key": secret}, status_code=201)

    @router.get("/keys")
    async def list_keys(request: Request, tenant: str | None = None) -> dict[str, Any]:
        """Every managed key (or one tenant's), oldest first; never a key or its digest."""
        keys = admin(request)
        now = time.time()
        used = await keys.last_used()
        shown = [r.public(now, used.get(r.id)) for r in keys.records() if tenant is None or r.tenant == tenant]
        return {"object": "list", "data": shown}

    @router.get("/keys/{key_id}")
    async def get_key(request: Request, key_id: str) -> dict[str, Any]:
        keys = admin(request)
        record = _known(keys, key_id)
        return record.public(time.time(), (await keys.last_used()).get(key_id))

    @router.post("/keys/{key_id}/rotate", status_code=201)
    async def rotate_key(request: Request, key_id: str, body: Rotation | None = None) -> JSONResponse:
        """A new key with the old one's tenant and settings; the old one stops at once, or after ``grace_s``."""
        keys = admin(request)
        _known(keys, key_id)
        now = time.time()
        try:
            secret, new, old = await keys.rotate(key_id, now, (body or Rotation()).grace_s)
        except UnknownKey:
            raise _no_key(key_id) from None
        except ValueError as exc:
            raise ApiError(409, str(exc), code="key_not_active") from None
        except KeyStoreUnavailable:
            raise _store_down() from None
        return JSONResponse({**new.public(now), "key": secret, "previous": old.public(now)}, status_code=201)

    @router.delete("/keys/{key_id}")
    async def revoke_key(request: Request, key_id: str) -> dict[str, Any]:
        """Revoke a key: it fails at once on every gateway process. Revoking a revoked key changes nothing."""
        keys = admin(request)
        _known(keys, key_id)
        now = time.time()
        try:
            record = await keys.revoke(key_id, now)
        except UnknownKey:
            raise _no_key(key_id) from None
        except KeyStoreUnavailable:
            raise _store_down() from None
        return record.public(now)

    return router


def _known(keys: ManagedKeys, key_id: str) -> ManagedKey:
    record = keys.get(key_id)
    if record is None:
        raise _no_key(key_id)
    return record


def _no_key(key_id: str) -> ApiError:
    return ApiError(404, f"There is no managed key '{key_id}'.", code="key_not_found")


def _store_down() -> ApiError:
    return ApiError(
        503,
        "The key store (Redis) is unreachable: keys cannot be changed now. Retry later.",
        code="key_store_unavailable",
    )


def _expiry(body: NewKey, now: float) -> float | None:
    """``expires_at`` (unix seconds or ISO-8601) or ``expires_in_s`` from now; a time already past is refused."""
    if body.expires_at is not None and body.expires_in_s is not None:
        raise ApiError(400, "Give expires_at or expires_in_s, not both.", param="expires_at")
    if body.expires_in_s is not None:
        return now + body.expires_in_s
    if body.expires_at is None:
        return None
    at = body.expires_at
    if isinstance(at, str):
        at = _parse_time(at)
    if not math.isfinite(at):
        raise ApiError(400, "expires_at must be a time.", param="expires_at")
    if at <= now:
        raise ApiError(400, "expires_at is in the past.", param="expires_at")
    if at > _LATEST:
        raise ApiError(400, "expires_at is after the year 9999.", param="expires_at")
    return at


def _parse_time(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
    except (ValueError, OverflowError):
        raise ApiError(
            400, f"expires_at {text!r} is neither unix seconds nor an ISO-8601 time.", param="expires_at"
        ) from None


def _key_limits(body: NewKey) -> KeyLimits:
    limits, budget = body.limits or _Limits(), body.budget or _Budget()
    return KeyLimits(
        requests_per_minute=limits.requests_per_minute,
        tokens_per_minute=limits.tokens_per_minute,
        usd_per_day=budget.usd_per_day,
        usd_per_month=budget.usd_per_month,
    )
