"""Credential scrubbing and error classification on synthetic exceptions (no network)."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from spillgate.backends.hosted import HostedModel
from spillgate.backends.hosted.errors import classify
from spillgate.backends.hosted.scrub import REDACTED, RedactingFilter, scrub

KEY = "sk-proj-Abc123Def456Ghi789"


def test_scrub_removes_the_exact_secret_and_credential_shapes() -> None:
    assert scrub(f"Incorrect API key provided: {KEY}.", [KEY]) == f"Incorrect API key provided: {REDACTED}."
    assert scrub("plain-secret-value leaked", ["plain-secret-value"]) == f"{REDACTED} leaked"
    assert KEY not in scrub(f"headers={{'Authorization': 'Bearer {KEY}'}}")
    assert "AKIAABCDEFGHIJKLMNOP" not in scrub("aws key AKIAABCDEFGHIJKLMNOP")
    assert scrub("x-api-key: abcdef123456") == f"x-api-key: {REDACTED}"
    assert scrub("api_key='hunter2hunter2'") == f"api_key='{REDACTED}'"
    assert scrub("nothing to hide here") == "nothing to hide here"


def test_the_log_filter_redacts_records() -> None:
    record = logging.LogRecord("LiteLLM", logging.DEBUG, __file__, 1, "sent %s", (f"Bearer {KEY}",), None)
    assert RedactingFilter().filter(record)
    assert KEY not in record.getMessage() and REDACTED in record.getMessage()


def test_the_models_repr_hides_its_credentials() -> None:
    model = HostedModel("bedrock", "bedrock/x", api_key=KEY, params={"aws_secret_access_key": "wJalrXUtnFEMIK7"})
    assert KEY not in repr(model) and "wJalrXUtnFEMIK7" not in repr(model)
    assert set(model.secrets()) == {KEY, "wJalrXUtnFEMIK7"}


def _status_error(status: int, body: dict[str, object], headers: dict[str, str] | None = None) -> Exception:
    import litellm

    request = httpx.Request("POST", "https://api.example.com/v1/chat/completions")
    response = httpx.Response(status, headers=headers, json=body, request=request)
    classes = {
        429: litellm.RateLimitError,
        400: litellm.BadRequestError,
        401: litellm.AuthenticationError,
        503: litellm.ServiceUnavailableError,
    }
    cls = classes.get(status, litellm.InternalServerError)
    return cls(message=f"OpenAIException - {json.dumps(body)}", llm_provider="openai", model="m", response=response)


@pytest.mark.parametrize(
    ("status", "kind"), [(429, "rate_limited"), (400, "bad_request"), (401, "bad_request"), (503, "server_error")]
)
def test_statuses_map_to_kinds(status: int, kind: str) -> None:
    exc = _status_error(status, {"error": {"message": f"provider said no to {KEY}"}}, {"retry-after": "7"})
    error = classify(exc, model="m", secrets=(KEY,), streamed_anything=False)
    assert error.kind == kind and error.status == status
    assert error.retry_after_s == (7.0 if kind == "rate_limited" else None)
    assert error.message == f"provider said no to {REDACTED}" and KEY not in str(error)


def test_a_wrapped_refusal_is_connect_and_a_wrapped_timeout_is_timeout() -> None:
    import litellm

    refused = litellm.InternalServerError(message="Connection error.", llm_provider="openai", model="m")
    refused.__cause__ = ConnectionRefusedError(111, "Connect call failed")
    assert classify(refused, model="m", secrets=(), streamed_anything=False).kind == "connect"
    timed_out = litellm.Timeout(message="Request timed out.", model="m", llm_provider="openai")
    assert classify(timed_out, model="m", secrets=(), streamed_anything=True).kind == "timeout"
    broken = litellm.APIConnectionError(message="Stream ended before a finish_reason", llm_provider="x", model="m")
    assert classify(broken, model="m", secrets=(), streamed_anything=True).kind == "malformed"
