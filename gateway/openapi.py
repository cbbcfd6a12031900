"""The OpenAPI description of the two generation endpoints.

They are served by plain ASGI handlers ahead of FastAPI (see ``gateway.app``), so FastAPI cannot describe
them itself; this adds them to ``/openapi.json`` so ``/docs``, client generators and the fuzz test see the
whole API. Only the fields the gateway checks are constrained; others pass through to the backend.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from spillgate.gateway.faces import messages_openapi

_ERROR = {
    "description": "An error in OpenAI's format.",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["error"],
                "properties": {
                    "error": {
                        "type": "object",
                        "properties": {
                            "message": {"type": "string"},
                            "type": {"type": "string"},
                            "param": {"type": ["string", "null"]},
                            "code": {"type": ["string", "null"]},
                        },
                    }
                },
            }
        }
    },
}

_COMMON: dict[str, Any] = {
    "model": {"type": "string", "description": "A route name or alias (GET /v1/models lists them)."},
    "max_tokens": {"type": "integer", "minimum": 1},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "user": {"type": "string", "maxLength": 256, "description": "The end user, kept with the request's spend."},
}

_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
        "name": {"type": "string"},
    },
}

_CHAT = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {**_COMMON, "messages": {"type": "array", "minItems": 1, "items": _MESSAGE}},
}

_COMPLETION = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {
        **_COMMON,
        "prompt": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    },
}


_EMBEDDING = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": _COMMON["model"],
        "input": {
            "oneOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}},
                {"type": "array", "items": {"type": "integer"}},
                {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
            ]
        },
        "encoding_format": {"type": "string", "enum": ["float", "base64"]},
        "dimensions": {"type": "integer", "minimum": 1},
        "user": _COMMON["user"],
    },
}

_RESPONSE = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": _COMMON["model"],
        "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
        "instructions": {"type": "string"},
        "previous_response_id": {"type": "string", "description": "A response this tenant stored, to continue."},
        "store": {"type": "boolean"},
        "stream": {"type": "boolean"},
        "max_output_tokens": {"type": "integer", "minimum": 1},
        "tools": {"type": "array", "items": {"type": "object"}},
        "tool_choice": {"oneOf": [{"type": "string"}, {"type": "object"}]},
        "text": {"type": "object"},
        "temperature": _COMMON["temperature"],
        "top_p": _COMMON["top_p"],
        "metadata": {"type": "object"},
        "user": _COMMON["user"],
    },
}


def _operation(summary: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "security": [{"bearer": []}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": {
                "200": {
                    "description": "The completion, or its server-sent events when ``stream`` is true.",
                    "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {}},
                },
                **{status: _ERROR for status in ("400", "401", "403", "404", "413", "422", "429", "502", "503", "504")},
            },
        }
    }


def install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` include the generation endpoints and bearer authentication."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schema["paths"]["/v1/chat/completions"] = _operation("Create a chat completion", _CHAT)
            schema["paths"]["/v1/completions"] = _operation("Create a text completion", _COMPLETION)
            schema["paths"]["/v1/messages"] = messages_openapi.OPERATION
            schema["paths"]["/v1/embeddings"] = _operation("Create embeddings", _EMBEDDING)
            responses = schema["paths"].setdefault("/v1/responses", {})
            responses.update(_operation("Create a model response (stored for previous_response_id)", _RESPONSE))
            components = schema.setdefault("components", {})
            components.setdefault("securitySchemes", {})["bearer"] = {"type": "http", "scheme": "bearer"}
            components["securitySchemes"]["x-api-key"] = messages_openapi.SECURITY_SCHEME
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
