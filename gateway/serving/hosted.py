"""Serving a request on a hosted model, relayed in OpenAI's format whatever the provider: through litellm, or
straight for the streams of OpenAI-compatible providers (:mod:`backends.hosted.direct`); embeddings through
litellm's ``aembedding`` (:mod:`backends.hosted.embeddings`).

One implementation of :class:`~gateway.serving.upstream.Upstream`. A failure before the client saw a byte becomes
:class:`~gateway.serving.exchange.TryElsewhere`, so the gateway can fall back to another candidate (replicas or
another provider); a failure mid-stream is reported in-band, as OpenAI does. Provider keys never reach the
client: error messages come from ``backends.hosted``, which scrubs them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import httpx

from spillgate.backends.hosted import HostedCompletion, HostedError, HostedModel
from spillgate.gateway.errors import ApiError
from spillgate.gateway.serving.exchange import JSON_HEADERS, TryElsewhere, send_answer
from spillgate.gateway.serving.relay import embedding_usage, send_event_error, start_stream
from spillgate.gateway.serving.upstream import UpstreamCall

log = logging.getLogger("spillgate.hosted")

_STATUS = {
    "rate_limited": 429,
    "server_error": 502,
    "timeout": 504,
    "connect": 502,
    "malformed": 502,
    "bad_request": 400,
}


class HostedUpstream:
    """Every hosted model of the config, by backend name."""

    follows_prefill = False

    def __init__(self, models: Callable[[], Mapping[str, HostedModel]], http: httpx.AsyncClient | None = None) -> None:
        self._models = models
        """The running config's hosted models (a new version replaces them)."""
        self._http = http
        """For the streams of OpenAI-compatible providers, relayed without litellm; None: all through litellm."""

    async def serve(self, call: UpstreamCall) -> str:
        from spillgate.backends.hosted.client import complete  # imports litellm: loaded at start-up by build_state

        attempt, ticket, send = call.attempt, call.ticket, call.send
        name = ticket.backend.name
        try:
            trace = {key.decode(): value.decode() for key, value in attempt.upstream_trace}
            result = await complete(self._models()[name], call.parsed.payload, http=self._http, headers=trace)
        except HostedError as exc:
            raise _try_elsewhere(exc, name) from None
        if isinstance(result, HostedCompletion):
            attempt.first_token_at = ticket.first_token()
            attempt.usage = result.usage.to_openai() if result.usage else None
            attempt.cost_usd = result.cost_usd
            ticket.reported(attempt.usage)
            await send_answer(send, attempt, 200, JSON_HEADERS, result.body)
            return "ok"
        try:
            events = aiter(result)
            try:
                first = await anext(events)
            except StopAsyncIteration:
                first = b""
            except HostedError as exc:
                raise _try_elsewhere(exc, name) from None
            await start_stream(attempt, send)
            attempt.first_token_at = ticket.first_token()
            await send({"type": "http.response.body", "body": first, "more_body": True})
            try:
                async for chunk in events:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except HostedError as exc:
                await send_event_error(send, attempt, _api_error(exc, name))
                return "error"
            await send({"type": "http.response.body", "body": b""})
            attempt.usage = result.usage.to_openai() if result.usage else None
            attempt.cost_usd = result.cost_usd
            return "ok"
        finally:
            await result.aclose()


class HostedEmbeddingsUpstream:
    """Every hosted embeddings model of the config, by backend name, through litellm's ``aembedding``."""

    follows_prefill = False

    def __init__(self, models: Callable[[], Mapping[str, HostedModel]]) -> None:
        self._models = models

    async def serve(self, call: UpstreamCall) -> str:
        from spillgate.backends.hosted.embeddings import embed  # imports litellm: loaded at start-up by build_state

        attempt, ticket = call.attempt, call.ticket
        name = ticket.backend.name
        try:
            trace = {key.decode(): value.decode() for key, value in attempt.upstream_trace}
            result = await embed(self._models()[name], call.parsed.payload, headers=trace)
        except HostedError as exc:
            raise _try_elsewhere(exc, name) from None
        attempt.first_token_at = ticket.first_token()
        attempt.usage = embedding_usage({"prompt_tokens": result.prompt_tokens})
        attempt.cost_usd = result.cost_usd
        ticket.reported(attempt.usage)
        await send_answer(call.send, attempt, 200, JSON_HEADERS, result.body)
        return "ok"


_CREDENTIALS_REFUSED = (401, 402, 403)
"""A provider refusing the gateway's key or account: the operator's to fix, not the client's request."""


def _api_error(exc: HostedError, backend: str) -> ApiError:
    if exc.kind == "bad_request" and exc.status in _CREDENTIALS_REFUSED:
        log.warning("hosted model %s refused the gateway's credentials (%s): check its api_key", backend, exc.status)
        return ApiError(502, "The hosted model refused the gateway's credentials.", code="hosted_auth")
    status = _STATUS.get(exc.kind, 502)
    if exc.kind == "bad_request" and exc.status and 400 <= exc.status < 500:
        status = exc.status
    headers = {"retry-after": str(max(1, round(exc.retry_after_s)))} if exc.retry_after_s else {}
    return ApiError(status, f"The hosted model failed: {exc}", code=f"hosted_{exc.kind}", headers=headers)


def _try_elsewhere(exc: HostedError, backend: str) -> TryElsewhere:
    """Anything but a rejected request may succeed elsewhere, as long as nothing was streamed yet."""
    rejected = exc.kind == "bad_request" and exc.status not in _CREDENTIALS_REFUSED
    return TryElsewhere(_api_error(exc, backend), retryable=not rejected and not exc.streamed_anything)
