"""Errors in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``, typed by status as
Anthropic types them, so its SDK raises the same exception class it would against Anthropic."""

from __future__ import annotations

from typing import Any

import orjson

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_object(status: int, message: str) -> dict[str, str]:
    """Anthropic's inner error object for an answer with ``status``."""
    kind = _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": kind, "message": message}


def error_body(status: int, error: dict[str, Any]) -> bytes:
    """Anthropic's error body for ``status`` and an OpenAI error object (its message kept)."""
    message = error.get("message")
    if not isinstance(message, str) or not message:
        message = "The request failed."
    return orjson.dumps({"type": "error", "error": error_object(status, message)})
