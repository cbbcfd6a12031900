"""The operator dashboard at ``/dashboard``: spend, savings, latencies, spills and replica load."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.state import GatewayState


def dashboard_router(state: GatewayState) -> APIRouter:
    """Routes of the dashboard page, its assets and its data."""
    return APIRouter()
