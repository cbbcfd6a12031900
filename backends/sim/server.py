"""Builds the ASGI app of a simulated SGLang replica."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

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
    app.include_router(native_routes.router)
    app.include_router(openai_routes.router)
    return app
