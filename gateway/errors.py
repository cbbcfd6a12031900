"""Errors in OpenAI's format: ``{"error": {"message", "type", "param", "code"}}``, never a traceback."""

from __future__ import annotations

import orjson

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class ApiError(Exception):
    """An error the client should see; raised anywhere on the request path, rendered by the app."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> bytes:
        return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> bytes:
    error_type = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return orjson.dumps({"error": {"message": message, "type": error_type, "param": param, "code": code}})


SERVED = (
    "POST /v1/chat/completions",
    "POST /v1/completions",
    "POST /v1/responses",
    "GET /v1/responses/{id}",
    "DELETE /v1/responses/{id}",
    "POST /v1/messages",
    "POST /v1/embeddings",
    "GET /v1/models",
    "GET /v1/models/{model}",
    "GET /v1/spend",
    "GET /v1/spend/logs",
    "GET /health",
    "GET /ready",
    "GET /openapi.json",
)
"""What a client may call, named in every unknown-path answer (the ``/v1`` prefix is optional on the generation
endpoints and the models; the admin API and the dashboard are in ``/openapi.json``)."""

_NOT_YET = {
    "/v1/moderations": "moderations",
    "/v1/audio": "audio",
    "/v1/images": "images",
    "/v1/files": "files",
    "/v1/batches": "batches",
    "/v1/assistants": "assistants",
    "/v1/threads": "assistants threads",
    "/v1/fine_tuning": "fine-tuning",
    "/v1/rerank": "reranking",
}
"""Endpoints of OpenAI's and Anthropic's APIs (and their sub-paths) that clients call and this gateway does not
serve: named as such, so a client learns it is not a typo."""


def unknown_path(method: str, path: str) -> ApiError:
    """The 404 for a path nothing serves: what it is, if it is a known API this gateway lacks, and what is served."""
    served = f"This gateway serves {', '.join(SERVED)}."
    versioned = path if path.startswith("/v1/") else "/v1" + path
    for prefix, what in _NOT_YET.items():
        if versioned == prefix or versioned.startswith(prefix + "/"):
            message = f"{method} {_shown(path)} ({what}) is not supported by this gateway yet. {served}"
            return ApiError(404, message, code="unsupported_endpoint")
    return ApiError(404, f"Unknown path: {method} {_shown(path)}. {served}", code="unsupported_endpoint")


def wrong_method(method: str, path: str, allowed: str) -> ApiError:
    """The 405 for a served path called with another method; ``allowed`` is the ``Allow`` header's value."""
    return ApiError(
        405,
        f"{method} is not allowed on {_shown(path)}; use {' or '.join(allowed.split(', '))}.",
        code="method_not_allowed",
        headers={"allow": allowed},
    )


def _shown(path: str) -> str:
    """A client's path as an error message repeats it: cut short, so a huge path is not echoed back whole."""
    return path if len(path) <= 200 else path[:200] + "..."
