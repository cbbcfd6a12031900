"""The admin API: the running config, its history, live edits, rollbacks and the file's word. Admin keys only."""

from __future__ import annotations

from typing import Any

import orjson
import redis.asyncio as aioredis
import yaml
from fastapi import APIRouter, Request
from fastapi.responses import Response

from spillgate.gateway.control.config import ConfigError
from spillgate.gateway.control.live_config import LiveConfig
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
    async def get_config(request: Request) -> dict[str, Any]:
        """The running config, secrets redacted: send it back edited with ``PUT``. ``file`` compares it with the
        config file: the edits the file lacks, and a file content not applied (and why)."""
        config, _ = live(request)
        return {
            "version": config.current.version,
            "config": config.current.raw,
            "file": config.file_status(),
            "warnings": config.warnings,
        }

    @router.put("/config")
    async def put_config(request: Request) -> Response:
        """Validate a whole config and swap it in; refused whole, every problem listed, when invalid."""
        config, admin = live(request)
        raw = _parse_body(await request.body(), request.headers.get("content-type", ""))
        return await _change(config.propose(raw, f"admin:{admin.key_id}", keeping_admin=admin.digest))

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


async def _change(change: Any) -> Response:
    try:
        version = await change
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
