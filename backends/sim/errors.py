"""Error bodies in the shapes SGLang returns, and handlers that turn bad input into HTTP 400."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError

from spillgate.backends.sim.wire import OrjsonResponse


def error_body(message: str, err_type: str = "BadRequestError", code: int = 400) -> dict[str, Any]:
    """SGLang's OpenAI-style ErrorResponse: flat, with ``object: "error"``."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}


def error_response(message: str, err_type: str = "BadRequestError", code: int = 400) -> OrjsonResponse:
    return OrjsonResponse(error_body(message, err_type, code), status_code=code)


def native_error_response(message: str, code: int = 400) -> OrjsonResponse:
    """The ``{"error": {"message": ...}}`` shape SGLang's native endpoints (/generate) use."""
    return OrjsonResponse({"error": {"message": message}}, status_code=code)


async def _validation_error(request: Request, exc: Exception) -> OrjsonResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(validation_message(exc), HTTPStatus.BAD_REQUEST.phrase, HTTPStatus.BAD_REQUEST.value)


def validation_message(exc: RequestValidationError) -> str:
    """One line per problem: where it is and what is wrong (no source paths, unlike str(exc))."""
    problems = []
    for error in exc.errors():
        location = ".".join(str(part) for part in error.get("loc", ()))
        problems.append(f"{location}: {error.get('msg', 'invalid value')}")
    return f"{len(problems)} validation error(s): " + "; ".join(problems)


async def _http_error(request: Request, exc: Exception) -> OrjsonResponse:
    assert isinstance(exc, HTTPException)
    return error_response(str(exc.detail), str(exc.status_code), exc.status_code)


def install_error_handlers(app: FastAPI) -> None:
    """Validation errors (malformed JSON included) become 400 instead of FastAPI's 422.

    Like SGLang, only FastAPI's HTTPException is reshaped; routing errors (404, 405) keep
    Starlette's ``{"detail": ...}`` body.
    """
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
