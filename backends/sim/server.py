"""Builds the ASGI app of a simulated SGLang replica."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from backends.sim import native_routes, openai_routes
from backends.sim.config import ReplicaConfig
from backends.sim.errors import install_error_handlers
from backends.sim.replica import Replica


def create_app(config: ReplicaConfig) -> FastAPI:
    """An app serving SGLang's endpoints; its scheduler task lives for the app's lifespan.

    ``app.state.stop_generation()`` aborts all requests, so a shutting-down server can close its
    open streams instead of waiting for them.
    """
    replica = Replica(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        replica.scheduler.start()
        try:
            yield
        finally:
            await replica.scheduler.stop()

    app = FastAPI(title="spillgate SGLang simulator", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.replica = replica
    app.state.stop_generation = replica.scheduler.abort_all
    install_error_handlers(app)
    if config.api_key is not None:
        require_api_key(app, config.api_key)
    app.include_router(native_routes.router)
    app.include_router(openai_routes.router)
    return app


_OPEN_PATHS = ("/health", "/ready", "/metrics")
"""What SGLang's ``--api-key`` leaves open (``utils/auth.py``): probes and scrapes need no key."""


def require_api_key(app: FastAPI, api_key: str) -> None:
    """Refuse every other route without ``Authorization: Bearer <api_key>``: 401 ``{"error": "Unauthorized"}``.
    Plain ASGI, so streamed responses pass through untouched."""
    app.add_middleware(_ApiKey, api_key=api_key)


class _ApiKey:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self._app = app
        self._expected = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS" and not scope["path"].startswith(_OPEN_PATHS):
            headers = dict(scope["headers"])
            scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not secrets.compare_digest(token.strip(), self._expected):
                refusal = Response(b'{"error":"Unauthorized"}', status_code=401, media_type="application/json")
                await refusal(scope, receive, send)
                return
        await self._app(scope, receive, send)
