"""The OpenAPI description of ``POST /v1/messages``, for ``/openapi.json`` (:mod:`gateway.openapi` adds it).

Only what the face checks is constrained; the blocks it takes are named in their descriptions.
"""

from __future__ import annotations

from typing import Any

ERROR: dict[str, Any] = {
    "description": "An error in Anthropic's format.",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["type", "error"],
                "properties": {
                    "type": {"const": "error"},
                    "error": {
                        "type": "object",
                        "required": ["type", "message"],
                        "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
                    },
                },
            }
        }
    },
}

_BLOCKS = {
    "oneOf": [
        {"type": "string"},
        {
            "type": "array",
            "minItems": 1,
            "items": {"type": "object", "required": ["type"]},
            "description": "text, image (base64 or url), tool_use (assistant), tool_result (user) blocks",
        },
    ]
}

REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "max_tokens", "messages"],
    "additionalProperties": False,
    "properties": {
        "model": {"type": "string", "description": "A route name or alias (GET /v1/models lists them)."},
        "max_tokens": {"type": "integer", "minimum": 1},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {"role": {"enum": ["user", "assistant"]}, "content": _BLOCKS},
            },
        },
        "system": _BLOCKS,
        "stop_sequences": {"type": "array", "items": {"type": "string", "minLength": 1}},
        "stream": {"type": "boolean"},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": 0},
        "metadata": {"type": "object", "properties": {"user_id": {"type": "string", "maxLength": 256}}},
        "tools": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "input_schema"],
                "properties": {
                    "name": {"type": "string"},
                    "description": {"type": "string"},
                    "input_schema": {"type": "object"},
                },
            },
        },
        "tool_choice": {
            "type": "object",
            "required": ["type"],
            "properties": {
                "type": {"enum": ["auto", "any", "tool", "none"]},
                "name": {"type": "string"},
                "disable_parallel_tool_use": {"type": "boolean"},
            },
        },
        "service_tier": {"enum": ["auto", "standard_only"]},
    },
}

OPERATION: dict[str, Any] = {
    "post": {
        "summary": "Create a message (Anthropic's Messages API)",
        "security": [{"x-api-key": []}, {"bearer": []}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": REQUEST}}},
        "responses": {
            "200": {
                "description": "The message, or its server-sent events when ``stream`` is true.",
                "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {}},
            },
            **{status: ERROR for status in ("400", "401", "403", "404", "413", "429", "502", "503", "504")},
        },
    }
}
"""The path item for ``/v1/messages``."""

SECURITY_SCHEME: dict[str, Any] = {"type": "apiKey", "in": "header", "name": "x-api-key"}
"""Anthropic's key header, named ``x-api-key`` among the components' security schemes."""
