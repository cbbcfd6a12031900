"""What every answer leaves behind besides itself: its access-log line, the count of the refusal it was, the
output tokens it carried.

Called once per request when its answer has ended (or its client went), from the generation handler, the
control app's wrapper (:mod:`gateway.app`) and the connection guard (:mod:`gateway.serving.connections`). It
only hands values over: the line is formatted and written off the request's path
(:mod:`gateway.observability.access_log`).
"""

from __future__ import annotations

import time
from typing import Any

from spillgate.gateway.observability.access_log import AccessLog, AccessRecord
from spillgate.gateway.observability.metrics import ALL_TENANTS
from spillgate.gateway.observability.trace_context import trace_id_of
from spillgate.gateway.serving.exchange import Attempt
from spillgate.gateway.state import GatewayState

CLIENT_CLOSED = 499
"""The status logged for a request whose client went before any answer (nginx's convention)."""


def _shown(name: str) -> str:
    return "" if name == "-" else name


def _outcome(attempt: Attempt) -> str:
    """The attempt's outcome; one that never reached a backend was refused, or its client went first."""
    if attempt.served_by is not None or attempt.outcome != "error":
        return attempt.outcome
    return "refused" if attempt.status else "client_disconnected"


class RequestObserver:
    """Counts and logs finished requests; the app owns the access log it feeds."""

    def __init__(self, state: GatewayState, access: AccessLog) -> None:
        self._state = state
        self.access = access

    def finished(self, method: str, path: str, attempt: Attempt, payload: dict[str, Any] | None) -> None:
        """A generation request ended: ``payload`` is its parsed body, when it got that far."""
        metrics = self._state.metrics
        if attempt.refused:
            tenant = attempt.tenant.name if attempt.tenant is not None else ""
            metrics.refusals.labels(str(attempt.status), attempt.error_code, self._tenant_label(tenant)).inc()
        usage = attempt.usage
        if usage is not None and attempt.served_by is not None:
            output = usage.get("completion_tokens")
            if isinstance(output, int) and output > 0:
                metrics.output_tokens.labels(attempt.backend, attempt.route).inc(output)
        if not self.access.running:
            return
        settings = self._state.config.logging
        if not settings.access_log:
            return
        now = time.perf_counter()
        prompt = None
        if settings.include_prompt and payload is not None:
            prompt = payload.get("messages", payload.get("prompt", payload.get("input")))
        self.access.submit(
            AccessRecord(
                time=time.time(),
                request_id=attempt.request_id,
                method=method,
                path=path,
                status=attempt.status or CLIENT_CLOSED,
                duration_s=now - attempt.started,
                error_code=attempt.error_code,
                tenant=attempt.tenant.name if attempt.tenant is not None else "",
                route=_shown(attempt.route),
                backend=_shown(attempt.backend),
                reason=_shown(attempt.reason),
                outcome=_outcome(attempt),
                trace_id=attempt.trace_id or trace_id_of(attempt.client_trace),
                stream=attempt.stream,
                usage=attempt.usage,
                ttft_s=attempt.first_token_at - attempt.started if attempt.first_token_at else None,
                cost_usd=attempt.cost_usd,
                prompt=prompt,
            )
        )

    def answered(
        self,
        method: str,
        path: str,
        status: int,
        started: float,
        *,
        request_id: str = "",
        trace_id: str = "",
        error_code: str = "",
        tenant: str = "",
    ) -> None:
        """A request outside the generation path ended (the control app, or one refused with its connection): all
        its error answers are the gateway's own."""
        if status >= 400:
            self._state.metrics.refusals.labels(str(status), error_code, self._tenant_label(tenant)).inc()
        if not self.access.running or not self._state.config.logging.access_log:
            return
        self.access.submit(
            AccessRecord(
                time=time.time(),
                request_id=request_id,
                trace_id=trace_id,
                method=method,
                path=path,
                status=status or CLIENT_CLOSED,
                duration_s=time.perf_counter() - started,
                error_code=error_code,
                tenant=tenant,
            )
        )

    def _tenant_label(self, tenant: str) -> str:
        """Spend and refusals are labelled by tenant only where ``metrics.tenant_labels`` allows it."""
        return tenant if self._state.config.metrics.tenant_labels else ALL_TENANTS
