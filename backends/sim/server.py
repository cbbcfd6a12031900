"""Builds the ASGI app of a simulated SGLang replica."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from spillgate.backends.sim import (
    debug_routes,
    embedding_routes,
    native_routes,
    openai_routes,
    responses_routes,
    vllm_face,
)
from spillgate.backends.sim.config import ReplicaConfig
from spillgate.backends.sim.data_parallel import install_data_parallel
from spillgate.backends.sim.errors import install_error_handlers
from spillgate.backends.sim.replica import Replica
from spillgate.backends.sim.responses_store import ResponseStore, store_enabled


def create_app(config: ReplicaConfig) -> FastAPI:
    """An app serving SGLang's endpoints; its scheduler task lives for the app's lifespan.

    ``app.state.stop_generation()`` aborts all requests, so a shutting-down server can close its
    open streams instead of waiting for them.
    """
    replica = Replica(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if replica.kv_events is not None:
            await replica.kv_events.start()
        replica.scheduler.start()
        try:
            yield
        finally:
            await replica.scheduler.stop()
            if replica.kv_events is not None:
                await replica.kv_events.close()

    app = FastAPI(title="spillgate SGLang simulator", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.replica = replica
    app.state.stop_generation = replica.scheduler.abort_all
    app.state.response_store = ResponseStore(store_enabled(config))
    install_error_handlers(app)
    install_data_parallel(app, config)
    app.include_router(debug_routes.router)
    app.include_router(embedding_routes.router)
    if config.engine == "vllm":
        if config.api_key is not None:
            app.add_middleware(_ApiKey, api_key=config.api_key, guarded=vllm_face.GUARDED_PREFIXES)
        app.include_router(vllm_face.router)
        app.include_router(responses_routes.vllm_router)
        if os.environ.get("VLLM_SERVER_DEV_MODE", "0") not in ("", "0"):
            app.include_router(vllm_face.dev_router)
        return app
    if config.api_key is not None:
        app.add_middleware(_ApiKey, api_key=config.api_key)
    app.include_router(native_routes.router)
    app.include_router(openai_routes.router)
    app.include_router(responses_routes.sglang_router)
    return app


_OPEN_PATHS = ("/health", "/ready", "/metrics")
"""What SGLang's ``--api-key`` leaves open (``utils/auth.py``): probes and scrapes need no key."""


class _ApiKey:
    """Refuse a guarded route without ``Authorization: Bearer <api_key>``: 401 ``{"error": "Unauthorized"}``, as
    both engines answer. SGLang guards all but ``_OPEN_PATHS``, vLLM only its API prefixes. Plain ASGI, so
    streamed responses pass through untouched."""

    def __init__(self, app: ASGIApp, api_key: str, guarded: tuple[str, ...] | None = None) -> None:
        self._app = app
        self._expected = api_key.encode()
        self._guarded = guarded

    def _guards(self, path: str) -> bool:
        return path.startswith(self._guarded) if self._guarded is not None else not path.startswith(_OPEN_PATHS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS" and self._guards(scope["path"]):
            headers = dict(scope["headers"])
            scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not secrets.compare_digest(token.strip(), self._expected):
                refusal = Response(b'{"error":"Unauthorized"}', status_code=401, media_type="application/json")
                await refusal(scope, receive, send)
                return
        await self._app(scope, receive, send)
