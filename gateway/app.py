"""The ASGI application: a thin dispatcher that sends the two generation endpoints straight to their
hot-path handlers and everything else (health, models, metrics, later admin and dashboard) to FastAPI."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from spillgate.backends.backend import Backend
from spillgate.gateway.capacity.api import capacity_report, capacity_router, publish
from spillgate.gateway.control.admin import admin_router
from spillgate.gateway.dispatch.kv_feeds import KvEventFeeds
from spillgate.gateway.errors import ApiError, error_body, unknown_path, wrong_method
from spillgate.gateway.faces.bridge import FaceHandler
from spillgate.gateway.faces.messages import MessagesFace
from spillgate.gateway.faces.responses import ResponsesFace
from spillgate.gateway.faces.responses_api import responses_router
from spillgate.gateway.observability.access_log import AccessLog
from spillgate.gateway.observability.dashboard import dashboard_router
from spillgate.gateway.observability.trace_context import client_trace, trace_id_of
from spillgate.gateway.observability.tracing import Tracing
from spillgate.gateway.openapi import install_openapi
from spillgate.gateway.serving.drain import Drain
from spillgate.gateway.serving.embeddings import EmbeddingsHandler
from spillgate.gateway.serving.exchange import Receive, Scope, Send, header
from spillgate.gateway.serving.handler import CompletionsHandler
from spillgate.gateway.serving.observer import RequestObserver
from spillgate.gateway.serving.slots import InFlightLimit, ReadingBudget
from spillgate.gateway.state import GatewayState
from spillgate.gateway.tenancy.keys_api import keys_router
from spillgate.gateway.tenancy.spend_api import spend_router
from spillgate.gateway.tenancy.tenants import Tenant, require_metrics_token

log = logging.getLogger("spillgate.gateway")


class GatewayApp:
    """ASGI entry point. The dispatch is one dict lookup, so the hot path pays nothing for the rest.

    ``access_log``: where each request's line goes (default: standard output); it runs while the app does.
    ``tracing``: the generation requests' traces (default: off)."""

    def __init__(
        self, state: GatewayState, *, access_log: AccessLog | None = None, tracing: Tracing | None = None
    ) -> None:
        self.state = state
        self.access_log = access_log or AccessLog(lambda: state.config.logging.format)
        self.observer = RequestObserver(state, self.access_log)
        self.tracing = tracing or Tracing()
        self.drain = Drain()
        """The completions in flight, and whether the process is draining to stop (:mod:`gateway.lifecycle`)."""
        slots = InFlightLimit(lambda: state.config.limits.max_in_flight)
        reading = ReadingBudget(lambda: state.config.limits.max_reading_body_bytes)
        hot = (slots, reading, self.observer, self.tracing, self.drain)
        chat = CompletionsHandler(state, "/v1/chat/completions", *hot)
        completions = CompletionsHandler(state, "/v1/completions", *hot)
        authenticate = lambda authorization: state.tenants.authenticate(authorization)  # noqa: E731 (live config)
        messages = FaceHandler(MessagesFace(state), chat, authenticate)
        responses = FaceHandler(ResponsesFace(state), chat, authenticate)
        embeddings = EmbeddingsHandler(state, *hot)
        # A trailing slash is served, not redirected: clients do not repeat a POST body after a redirect. Without
        # "/v1" too, as LiteLLM serves them: clients given a base URL without it call these paths.
        served = {
            "/v1/chat/completions": chat,
            "/v1/completions": completions,
            "/v1/messages": messages,
            "/v1/responses": responses,
            "/v1/embeddings": embeddings,
        }
        self._hot = {
            alias + slash: handler
            for path, handler in served.items()
            for alias in (path, path.removeprefix("/v1"))
            for slash in ("", "/")
        }
        self._control = build_control_app(state, self.access_log, self.drain)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._control(scope, receive, send)
            return
        handler = self._hot.get(scope["path"])
        if handler is None:
            await self._serve_control(scope, receive, send)
            return
        try:
            await handler(scope, receive, send)
        except Exception:
            log.exception("unhandled error on %s", scope["path"])
            await _send_internal_error(send)

    async def _serve_control(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Everything but generation, through FastAPI; its status and error code noted for the access log."""
        started = time.perf_counter()
        answer = _Answer()

        async def watched(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                answer.status = message["status"]
            elif answer.status >= 400 and not answer.code and message["type"] == "http.response.body":
                answer.code = _error_code(message.get("body", b""))
            await send(message)

        try:
            await self._control(scope, receive, watched)
        finally:
            self.observer.answered(
                scope["method"],
                scope["path"],
                answer.status,
                started,
                request_id=_client_request_id(scope),
                trace_id=trace_id_of(client_trace(scope["headers"])),
                error_code=answer.code,
                tenant=_caller(self.state, scope),
            )

    def connection_refused(self, status: int, code: str) -> None:
        """The connection guard answered a request itself (too many connections, headers too slow, not HTTP)."""
        self.observer.answered("", "", status, time.perf_counter(), error_code=code)


class _Answer:
    """What the control app answered: its status and, for an error, its ``code``."""

    __slots__ = ("code", "status")

    def __init__(self) -> None:
        self.status = 0
        self.code = ""


def _error_code(body: bytes) -> str:
    """The ``code`` of an OpenAI error body; ``""`` for anything else."""
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return ""
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else ""


def _client_request_id(scope: Scope) -> str:
    given = header(scope, b"x-request-id")
    return given if given and len(given) <= 128 and given.isascii() and given.isprintable() else ""


def _caller(state: GatewayState, scope: Scope) -> str:
    """Whose key the request carried: a tenant's name, ``admin``, or ``""`` (none, or not a key of this gateway)."""
    authorization = header(scope, b"authorization")
    if authorization is None:
        return ""
    try:
        caller = state.tenants.authenticate_any(authorization)
    except ApiError:
        return ""
    return caller.name if isinstance(caller, Tenant) else "admin"


def _degraded(state: GatewayState) -> dict[str, bool]:
    """Which parts are running on a fallback: shared state on this process's own view because Redis is away
    or behind, or the ledger holding entries in memory because its file cannot be written."""
    shared = state.prefix.shared
    return {
        "accounting": state.accountant.degraded,
        "prefix_index": shared is not None and not shared.connected,
        "ledger": state.accountant.ledger.failing,
    }


def _routes_without_healthy_backend(state: GatewayState, now: float) -> list[str]:
    """The routes none of whose backends (dedicated ones included) is healthy now: their requests get 503."""
    healthy = {b.name for b in state.registry if b.state(now).healthy}
    unserved = []
    for route in {id(r): r for r in state.routes.values()}.values():
        if healthy.isdisjoint(route.targets) and all(healthy.isdisjoint(t) for t in route.dedicated_targets.values()):
            unserved.append(route.name)
    return sorted(unserved)


async def _send_internal_error(send: Send) -> None:
    body = error_body(500, "The gateway hit an internal error; it has been logged.", code="internal_error")
    try:
        await send({"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
    except RuntimeError:
        pass  # the response had already started; the client sees a cut-off stream


def build_control_app(state: GatewayState, access_log: AccessLog | None = None, drain: Drain | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await state.start()
        if access_log is not None:
            access_log.start()
        try:
            yield
        finally:
            await state.stop()
            if access_log is not None:
                access_log.stop()

    # Starlette's own trailing-slash redirect names the client's Host header as the target: see slash_redirect.
    app = FastAPI(title="spillgate", lifespan=lifespan, docs_url="/docs", redoc_url=None, redirect_slashes=False)
    started = int(time.time())

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> Response:
        return Response(exc.body(), status_code=exc.status, media_type="application/json", headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404 and (target := slash_redirect(app, request.scope)) is not None:
            return Response(status_code=307, headers={"location": target})
        if exc.status_code == 404:
            error = unknown_path(request.method, request.url.path)
        elif exc.status_code == 405:
            error = wrong_method(request.method, request.url.path, allowed_methods(app, request.scope))
        else:
            error = ApiError(exc.status_code, str(exc.detail), headers=dict(exc.headers or {}))
        return Response(error.body(), status_code=error.status, media_type="application/json", headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in first["loc"][1:]) or None
        return Response(error_body(422, first["msg"], param=param), status_code=422, media_type="application/json")

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> dict[str, object]:
        """Liveness: the process answers. Backend states are included for operators."""
        now = time.monotonic()
        backends = {
            b.name: {
                "healthy": b.state(now).healthy,
                "in_flight": b.own.in_flight,
                "peer_in_flight": b.peers.in_flight,
                "prefill_tokens_per_s": round(b.prefill.rate),
                "prefill_overhead_ms": round(b.prefill.overhead_s * 1000, 2),
                "prefill_overhead_busy_ms": round(b.prefill.busy_overhead_s * 1000, 2),
                "max_running": b.max_running,
                "ttft_ms": round(b.ttft_s * 1000, 1),
                "tpot_ms": round(b.tpot_s * 1000, 2),
                "last_error": b.last_error or None,
                **_replica_health(b, state.kv_feeds),
            }
            for b in state.registry
        }
        health: dict[str, object] = {"status": "ok", "pid": os.getpid(), "backends": backends}
        degraded = _degraded(state)
        if state.prefix.shared is not None:
            health["redis"] = "unreachable" if degraded["prefix_index"] else "connected"
            health["accounting"] = "degraded" if degraded["accounting"] else "ok"
            if state.peer_load is not None:
                health["peer_processes"] = state.peer_load.peers
        ledger = state.accountant.ledger
        health["ledger"] = f"failing: {ledger.queued} entries wait in memory" if degraded["ledger"] else "ok"
        unserved = _routes_without_healthy_backend(state, now)
        if unserved:
            health["routes_without_healthy_backend"] = unserved
        if any(degraded.values()) or unserved:
            health["status"] = "degraded"
        if drain is not None and drain.draining:
            health["draining"] = True
        if state.live is not None:
            health["config_version"] = state.live.current.version
            health["config_warnings"] = state.live.warnings
        return health

    @app.api_route("/ready", methods=["GET", "HEAD"])
    async def ready() -> Response:
        """Readiness: 200 only while at least one backend is healthy and the process is not draining to stop."""
        if drain is not None and drain.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if state.registry.any_healthy():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "no healthy backend"}, status_code=503)

    def model_entry(name: str) -> dict[str, object]:
        return {"id": name, "object": "model", "created": started, "owned_by": "spillgate"}

    @app.get("/models", include_in_schema=False)
    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, object]:
        tenant = state.tenants.authenticate(request.headers.get("authorization"))
        seen: set[str] = set()
        data = []
        for name, route in state.routes.items():
            if route.name in seen or not tenant.may_use(route.name):
                continue
            seen.add(route.name)
            data.append(model_entry(name))
        return {"object": "list", "data": data}

    @app.get("/models/{model:path}", include_in_schema=False)
    @app.get("/v1/models/{model:path}")
    async def model(model: str, request: Request) -> dict[str, object]:
        """One route by any of its names (``client.models.retrieve``), if the caller may use it."""
        tenant = state.tenants.authenticate(request.headers.get("authorization"))
        route = state.routes.get(model)
        if route is None or not tenant.may_use(route.name):
            raise ApiError(404, f"The model '{model}' does not exist.", param="model", code="model_not_found")
        return model_entry(model)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        require_metrics_token(state.config.metrics.token, request.headers.get("authorization"), "/metrics")
        for component, degraded in _degraded(state).items():
            state.metrics.degraded.labels(component).set(1.0 if degraded else 0.0)
        # Per-backend gauges describe the backends configured now: a backend a config change removed goes.
        state.metrics.clear_backend_gauges()
        for backend in state.registry:
            state.metrics.backend_healthy.labels(backend.name).set(1.0 if backend.healthy else 0.0)
            state.metrics.in_flight.labels(backend.name).set(backend.own.in_flight)
            if backend.kind == "replica":
                state.metrics.queued.labels(backend.name).set(backend.load.queued)
                state.metrics.running.labels(backend.name).set(backend.load.running)
                state.metrics.kv_usage.labels(backend.name).set(backend.load.token_usage)
                lag = state.kv_feeds.lag_s(backend.name)
                if lag is not None:
                    state.metrics.kv_events_lag.labels(backend.name).set(lag)
        for (name, source, outcome), count in state.prefix.predictions.items():
            state.metrics.prefix_predictions.labels(name, source, outcome).set(count)
        for gauge in (state.metrics.pool_rent, state.metrics.pool_rented_seconds, state.metrics.pool_busy_seconds):
            gauge.clear()  # pools a config change removed go
        for pool in state.rent.report(time.time()):
            state.metrics.pool_rent.labels(pool.pool).set(pool.rent_usd)
            state.metrics.pool_rented_seconds.labels(pool.pool).set(pool.replica_seconds)
            state.metrics.pool_busy_seconds.labels(pool.pool).set(pool.busy_seconds)
        publish(state.metrics, capacity_report(state))
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(admin_router(state))
    app.include_router(spend_router(state))
    app.include_router(keys_router(state))
    app.include_router(capacity_router(state))
    app.include_router(dashboard_router(state))
    app.include_router(responses_router(state))
    install_openapi(app)
    return app


def _replica_health(backend: Backend, feeds: KvEventFeeds) -> dict[str, object]:
    """A replica's engine, what it told the gateway about itself, the features it lacks (with their flags), and
    where its prefix predictions come from (its KV-cache events, or the gateway's belief)."""
    if backend.kind != "replica":
        return {}
    info = backend.info
    return {
        "engine": backend.engine.name,
        "capabilities": info.capabilities() if info is not None else None,
        "degraded": list(info.missing) if info is not None else [],
        "outlier": _outlier_health(backend, time.monotonic()),
        "prefix": feeds.status(backend),
    }


def _outlier_health(backend: Backend, now: float) -> dict[str, object]:
    """Passive outlier detection's view of a replica (:mod:`backends.outlier`): ``ejected`` while out of
    rotation for failing real requests, whatever its probes say."""
    breaker = backend.breaker
    shown = breaker.shown(now)
    return {
        "state": shown,
        "ejected": shown == "ejected",
        "ejected_for_s": round(breaker.ejected_until - now, 1) if shown == "ejected" else 0.0,
        "consecutive_failures": breaker.consecutive,
        "ejections": breaker.total_ejections,
        "last_failure": breaker.last_failure or None,
    }


def allowed_methods(app: FastAPI, scope: Scope) -> str:
    """Every method some route serves at the request's path (Starlette's own ``Allow`` names only the first route's,
    where one path has a route per method)."""
    methods: set[str] = set()
    for route in app.router.routes:
        served = getattr(route, "methods", None)
        if served and route.matches({**scope, "method": next(iter(served))})[0] is Match.FULL:
            methods |= served
    return ", ".join(sorted(methods))


def slash_redirect(app: FastAPI, scope: Scope) -> str | None:
    """Where a path with a trailing slash should go, when the path without it is served: as a path only, so a
    forged ``Host`` header never becomes the target, and never ``//host`` (a browser reads that as a host)."""
    path: str = scope["path"]
    stripped = path.rstrip("/")
    if stripped == path or not stripped.startswith("/") or stripped.startswith("//"):
        return None
    for route in app.router.routes:
        match, _ = route.matches({**scope, "path": stripped})
        if match is Match.FULL:
            query = scope.get("query_string", b"").decode("latin-1")
            return stripped + (f"?{query}" if query else "")
    return None
