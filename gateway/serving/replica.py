"""Serving an attempt on a self-hosted replica (SGLang, vLLM, any OpenAI-compatible server).

Everything that goes wrong before the client has seen a byte may be tried on another candidate; every answer
tells the replica's outlier detection (:mod:`backends.outlier`) whether the replica works. A client that goes
away cancels the task, which closes the upstream connection and so aborts the generation on the replica.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from spillgate.backends.backend import Backend
from spillgate.backends.http1 import Http1Client, HttpError, Response
from spillgate.backends.registry import BackendRegistry
from spillgate.gateway.errors import ApiError
from spillgate.gateway.observability.metrics import GatewayMetrics
from spillgate.gateway.serving.exchange import TryElsewhere
from spillgate.gateway.serving.relay import Failure, OnAnswer, OnFailure, relay_client_error, relay_stream, relay_whole
from spillgate.gateway.serving.upstream import UpstreamCall
from spillgate.gateway.tenancy.tenants import Tenant

log = logging.getLogger("spillgate.serving")

_UPSTREAM_STATUS = {"connect": 502, "protocol": 502, "timeout": 504}
_FAILURES = {
    "connect": "The backend could not be reached.",
    "protocol": "The backend broke off or sent an invalid response.",
    "timeout": "The backend sent nothing for longer than the gateway's read timeout.",
}
"""What a client is told; which replica failed, and how, goes to the log (replica names are internal)."""


WholeRelay = Callable[[UpstreamCall, Response, OnFailure, OnAnswer], Awaitable[str]]


class ReplicaUpstream:
    """The replicas of every pool, reached through the gateway's own HTTP/1.1 client."""

    follows_prefill = True

    def __init__(
        self,
        client: Http1Client,
        registry: BackendRegistry,
        metrics: GatewayMetrics,
        whole: WholeRelay = relay_whole,
    ) -> None:
        self._client = client
        self._registry = registry
        self._metrics = metrics
        self._whole = whole
        """How a whole answer is checked and relayed: a completion's, or (for ``/v1/embeddings``) embeddings'."""

    async def serve(self, call: UpstreamCall) -> str:
        backend = call.ticket.backend
        trial = self._registry.dispatched(backend)
        try:
            return await self._serve(call, backend)
        finally:
            if trial:
                self._registry.trial_abandoned(backend)  # no verdict (the client left): the next request tries

    async def _serve(self, call: UpstreamCall, backend: Backend) -> str:
        parsed = call.parsed
        payload = parsed.payload
        prepare_replica_payload(payload, backend.served_model, call.attempt.tenant, backend.engine.owned_fields)
        if parsed.stream:
            # Always learn the usage; the relay strips that chunk if the client did not ask for it.
            payload["stream_options"] = {**(payload.get("stream_options") or {}), "include_usage": True}
        try:
            headers = backend.request_headers
            if call.ticket.dp_rank is not None:
                headers += backend.engine.to_rank(payload, call.ticket.dp_rank)
            if call.attempt.upstream_trace:
                headers += call.attempt.upstream_trace  # the client's trace, or this gateway's span in it
            response = await self._client.post(backend.base_url, call.path, orjson.dumps(payload), headers)
        except HttpError as exc:
            # Nothing reached the client: a timeout may still be generating, but closing the connection aborts it.
            raise TryElsewhere(self._failed(backend, exc), retryable=True) from None
        try:
            if response.status >= 500:
                self._failed(backend, f"answered {response.status}")
                raise TryElsewhere(
                    ApiError(502, f"The backend answered {response.status}.", code="backend_error"), retryable=True
                )
            if response.status in (401, 403):
                # The gateway's own key was refused, not the client's: a misconfigured pool, worth another replica.
                log.warning(
                    "backend %s refused the gateway's key (%s): check the pool's api_key", backend.name, response.status
                )
                self._failed(backend, f"refused the gateway's key ({response.status})")
                raise TryElsewhere(
                    ApiError(502, "The backend refused the gateway's credentials.", code="backend_auth"),
                    retryable=True,
                )
            if response.status >= 400:
                self._registry.request_succeeded(backend)  # an answer about the request: the replica works
                return await relay_client_error(call, response)

            def failed(failure: Failure) -> ApiError:
                return self._failed(backend, failure)

            def answered() -> None:
                self._registry.request_succeeded(backend)

            relay = relay_stream if parsed.stream else self._whole
            return await relay(call, response, failed, answered)
        finally:
            response.close()

    def _failed(self, backend: Backend, failure: Failure) -> ApiError:
        """Tell the replica's outlier detection a request failed there (counting an ejection if it was one), log
        which and why, and return what the client is told: neither the replica's name nor its words."""
        if isinstance(failure, HttpError):
            log.info("backend %s failed: %s", backend.name, failure)
            error = ApiError(_UPSTREAM_STATUS[failure.kind], _FAILURES[failure.kind], code=f"backend_{failure.kind}")
            reason = f"{failure.kind}: {failure}"
        else:
            error = ApiError(502, "The backend sent an invalid response.", code="backend_invalid_response")
            reason = f"invalid response: {failure}"
            log.warning("backend %s sent an invalid response: %s", backend.name, failure)
        unreachable = isinstance(failure, HttpError) and failure.kind == "connect"
        if self._registry.request_failed(backend, reason, unreachable=unreachable):
            self._metrics.ejections.labels(backend.name).inc()
        return error


def prepare_replica_payload(
    payload: dict[str, Any], served_model: str, tenant: Tenant | None, owned_fields: tuple[str, ...]
) -> None:
    """Rewrite a client's body for a replica: its model name, the tenant's cache salt, none of the fields its
    engine lets only the gateway set."""
    payload["model"] = served_model
    for owned in owned_fields:
        payload.pop(owned, None)
    salt = tenant.cache_salt(payload.pop("cache_salt", None)) if tenant else None
    if salt is not None:
        payload["cache_salt"] = salt
