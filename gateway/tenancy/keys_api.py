"""Managed tenant keys: ``/admin/keys`` to create, list, rotate and revoke them (not served yet)."""

from __future__ import annotations

from fastapi import APIRouter

from spillgate.gateway.state import GatewayState


def keys_router(state: GatewayState) -> APIRouter:
    return APIRouter(prefix="/admin")
