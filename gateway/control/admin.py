"""The admin API: the running config, its history, live edits, rollbacks and the file's word; one static replica
added or drained; every backend with where it came from. Admin keys only."""

from __future__ import annotations

import time
from typing import Any

import orjson
import redis.asyncio as aioredis
import yaml
from fastapi import APIRouter, Request
from fastapi.responses import Response

from spillgate.gateway.control.config import ConfigError, check_replica_url
from spillgate.gateway.control.live_config import LiveConfig
from spillgate.gateway.control.replica_edits import ReplicaEditRefused, add_replica, remove_replica
from spillgate.gateway.control.replica_names import discovered_name
from spillgate.gateway.errors import ApiError, error_body
from spillgate.gateway.state import GatewayState
from spillgate.gateway.tenancy.tenants import Admin


def admin_router(state: GatewayState) -> APIRouter:
    router = APIRouter(prefix="/admin")

    def live(request: Request) -> tuple[LiveConfig, Admin]:
        admin = state.tenants.authenticate_admin(request.headers.get("authorization"))
        if state.live is None:
            raise ApiError(503, "Live configuration is not enabled in this process.", code="config_unavailable")
        return state.live, admin

    @router.get("/config")
    async def get_config(request: Request) -> Response:
        """The running config, secrets redacted: send it back edited with ``PUT``. ``file`` compares it with the
        config file: the edits the file lacks, and a file content not applied (and why)."""
        config, _ = live(request)
        body = {
            "version": config.current.version,
            "config": config.current.raw,
            "file": config.file_status(),
            "warnings": config.warnings,
            "discovered": discovered(),
        }
        return Response(orjson.dumps(body), media_type="application/json", headers={"etag": _etag(body["version"])})

    def discovered() -> dict[str, list[dict[str, str]]]:
        """Replicas found at run time, by pool: runtime state, never part of ``config`` or of a version."""
        return {
            pool: [{"name": discovered_name(pool, r.pod), "pod": r.pod, "url": r.url} for r in replicas]
            for pool, replicas in state.discovery.replicas(state.config).items()
        }

    @router.get("/backends")
    async def backends(request: Request) -> dict[str, Any]:
        """Every backend now: where each replica came from (``config``, ``simulated``, ``discovered``), its health
        and requests in flight; replicas draining (gone from the config or their pod, finishing requests); and each
        pool's discovery with how its source answers."""
        state.tenants.authenticate_admin(request.headers.get("authorization"))
        now = time.monotonic()
        return {
            "backends": [_backend(b, now) for b in state.registry],
            "draining": [_backend(b, now) for b in state.registry.draining()],
            "discovery": state.discovery.status(),
        }

    @router.post("/pools/{pool}/replicas")
    async def add_pool_replica(pool: str, request: Request) -> Response:
        """Add one static replica (``{"url": "http://host:port"}``, ``"name"`` optional) to a pool: a config version
        like any edit. It goes by ``pool/name``, else ``pool/host:port``, and no other replica's name changes."""
        config, admin = live(request)
        body = _json_body(await request.body())
        url = _replica_url(body.get("url"))
        name = body.get("name")
        if name is not None and not isinstance(name, str):
            raise ApiError(422, "A replica's 'name' is a string.", param="name", code="invalid_replica_name")
        found = {p: [r.url for r in rs] for p, rs in state.discovery.replicas(state.config).items()}
        simulated = [u for urls in state.endpoints.replicas.values() for u in urls]
        edit = add_replica(pool, url, found, simulated, name)
        return await _change(config.edit(edit, f"admin:{admin.key_id}", keeping_admin=admin.digest))

    @router.delete("/pools/{pool}/replicas")
    async def remove_pool_replica(pool: str, request: Request) -> Response:
        """Drain one static replica out of a pool, given by ``?url=http://host:port`` or by ``?name=`` (as
        ``/admin/backends`` lists it): no new requests, those in flight finish; a config version like any edit.
        A discovered replica leaves with its pod instead."""
        config, admin = live(request)
        name = request.query_params.get("name")
        if name is not None and "url" in request.query_params:
            raise ApiError(
                422, "Give the replica's 'url' or its 'name', not both.", param="name", code="ambiguous_replica"
            )
        found = {p: {r.url: r.pod for r in rs} for p, rs in state.discovery.replicas(state.config).items()}
        if name is not None:
            if not name:
                raise ApiError(422, "A replica's 'name' is not empty.", param="name", code="invalid_replica_name")
            edit = remove_replica(pool, found, name=name)
        else:
            edit = remove_replica(pool, found, url=_replica_url(request.query_params.get("url")))
        return await _change(config.edit(edit, f"admin:{admin.key_id}", keeping_admin=admin.digest))

    @router.put("/config")
    async def put_config(request: Request) -> Response:
        """Validate a whole config and swap it in; refused whole, every problem listed, when invalid."""
        config, admin = live(request)
        base = _if_match(request.headers.get("if-match"))
        raw = _parse_body(await request.body(), request.headers.get("content-type", ""))
        return await _change(
            config.propose(raw, f"admin:{admin.key_id}", keeping_admin=admin.digest, base_version=base)
        )

    @router.get("/config/history")
    async def history(request: Request) -> dict[str, Any]:
        config, _ = live(request)
        return {
            "current": config.current.version,
            "history": config.history_owner(),
            "versions": [v.summary() for v in config.history()],
        }

    @router.post("/config/rollback/{version}")
    async def rollback(version: int, request: Request) -> Response:
        config, admin = live(request)
        if config.version(version) is None:
            raise ApiError(404, f"There is no config version {version}.", param="version", code="version_not_found")
        return await _change(config.rollback(version, f"admin:{admin.key_id}", keeping_admin=admin.digest))

    @router.post("/config/reload")
    async def reload(request: Request) -> Response:
        """Apply the config file as it is now, undoing the edits it lacks: the operator says the file wins."""
        config, admin = live(request)
        return await _change(config.reload(f"admin:{admin.key_id}"))

    return router


def _etag(version: int) -> str:
    return f'"{version}"'


def _if_match(value: str | None) -> int | None:
    """The config version an ``If-Match`` names (``"7"``, as ``GET /admin/config`` tags it); ``*`` or no header:
    none. Anything else is refused: a client that asks for a check must get one."""
    if value is None or value.strip() == "*":
        return None
    tag = value.strip().removeprefix("W/").strip('"')
    if not tag.isdigit() or "," in value:
        raise ApiError(
            400,
            'If-Match must be one config version as GET /admin/config tags it (ETag: "7").',
            param="If-Match",
            code="invalid_if_match",
        )
    return int(tag)


def _replica_url(url: object) -> str:
    """The URL checked as the config's ``replicas`` field checks it, refused here in the admin API's format."""
    if not isinstance(url, str) or not url:
        raise ApiError(422, "Give the replica's 'url' (http://host:port).", param="url", code="invalid_replica_url")
    try:
        return check_replica_url(url)
    except ValueError as exc:
        raise ApiError(422, f"{exc}.", param="url", code="invalid_replica_url") from None


def _json_body(body: bytes) -> dict[str, Any]:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"The body is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise ApiError(400, 'The body must be a JSON object: {"url": "http://host:port"}.')
    return parsed


def _backend(backend: Any, now: float) -> dict[str, Any]:
    shown: dict[str, Any] = {
        "name": backend.name,
        "kind": backend.kind,
        "healthy": backend.state(now).healthy,
        "in_flight": backend.own.in_flight,
    }
    if backend.kind == "replica":
        shown |= {"pool": backend.pool, "url": backend.base_url, "origin": backend.origin}
    return shown


async def _change(change: Any) -> Response:
    try:
        version = await change
    except ReplicaEditRefused as exc:
        raise ApiError(exc.status, exc.message, param=exc.param, code=exc.code) from None
    except ConfigError as exc:
        return _refused(exc)
    except (aioredis.RedisError, OSError):
        raise ApiError(
            503,
            "Redis is unreachable, so the change could not reach the other gateway processes; nothing changed.",
            code="config_store_unavailable",
            headers={"retry-after": "1"},
        ) from None
    return Response(
        orjson.dumps({"version": version.version, "diff": list(version.diff)}), media_type="application/json"
    )


_YamlLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_yaml(body: bytes) -> object:
    """YAML without aliases: through the API a few lines of them can expand to billions of nodes (and stall the
    event loop); a config sent over HTTP has no use for them. Checked on the parser's events, before building."""
    if any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(body, Loader=_YamlLoader)):
        raise yaml.YAMLError("anchors and aliases are not accepted through the admin API")
    return yaml.load(body, Loader=_YamlLoader)


def _parse_body(body: bytes, content_type: str) -> object:
    try:
        if "yaml" in content_type:
            return _load_yaml(body)
        return orjson.loads(body)
    except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
        raise ApiError(400, f"The config is not valid {'YAML' if 'yaml' in content_type else 'JSON'}: {exc}") from None


def _refused(exc: ConfigError) -> Response:
    """422 in OpenAI's error shape, plus every problem by field path (``problems``), from every check."""
    problems = exc.problems or [("(config)", str(exc))]
    first_path = problems[0][0]
    message = f"The config was refused ({len(problems)} problem(s)); the running config is unchanged. "
    message += "; ".join(f"{path}: {text}" for path, text in problems)
    body = orjson.loads(error_body(422, message, param=first_path, code="invalid_config"))
    body["problems"] = [{"path": path, "message": text} for path, text in problems]
    return Response(orjson.dumps(body), status_code=422, media_type="application/json")
