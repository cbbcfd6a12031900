"""The gateway with a per-request decision trace, for finding where a latency tail comes from.

    python -m tests.bench.trace_gateway --trace FILE serve --config my.yaml ...

Runs ``spillgate serve`` unchanged but for a wrapper around each route's policy and two hooks on the hot
path (installed here, not in the gateway): every finished request appends one JSON line to ``FILE`` with
what the policy saw (each candidate's state and predicted TTFT), what it chose, and what happened (sent,
first token, end, cached tokens), all on the gateway's ``perf_counter`` clock. Benchmarks only: the hooks
cost a few tens of microseconds per request.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import orjson

_last_decision: dict[str, Any] | None = None
_pending: dict[str, dict[str, Any]] = {}


class TracedPolicy:
    """Delegates to a policy and keeps what it saw and chose for the request being admitted."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.name = inner.name

    @property
    def uses_prefix(self) -> bool:
        return self._inner.uses_prefix

    def decide(self, request: Any, snapshot: Any) -> Any:
        global _last_decision
        from spillgate.policies.prediction import predicted_ttft

        decision = self._inner.decide(request, snapshot)
        _last_decision = {
            "decided_at": time.perf_counter(),
            "sequence": request.sequence,
            "prompt_tokens": request.prompt_tokens,
            "max_tokens": request.max_tokens,
            "chosen": decision.backend,
            "reason": decision.reason,
            "ranked": list(decision.ranked),
            "backends": [
                {**b._asdict(), "predicted_ttft_s": predicted_ttft(request, b)}
                for b in snapshot.backends
                if b.kind == "replica"
            ],
        }
        return decision


def install(path: str) -> None:
    # Wrapped before any gateway module imports it by name.
    from spillgate.policies import engine as policy_engine
    from spillgate.policies import registry as policy_registry

    build = policy_registry.build_policy
    policy_registry.build_policy = lambda name, params=None: TracedPolicy(build(name, params))
    reweigh = policy_engine.with_weights
    # A route's ``weights`` apply to the policy inside the tracer.
    policy_engine.with_weights = lambda policy, weights: TracedPolicy(reweigh(policy._inner, weights))

    from spillgate.gateway.serving import admission, forwarding

    out = open(path, "ab")  # noqa: SIM115  (open for the life of the process)

    decide = admission.Admission.decide

    def traced_decide(self: Any, request: Any, route: Any, targets: Any, attempt: Any) -> Any:
        # The policy ran synchronously inside: its record is this request's (a request deciding again, after
        # a budget refusal, keeps the last decision).
        global _last_decision
        decision = decide(self, request, route, targets, attempt)
        if _last_decision is not None:
            _pending[attempt.request_id] = _last_decision
            _last_decision = None
        return decision

    record = forwarding.record_outcome

    def traced_record(metrics: Any, attempt: Any, *args: Any, **kwargs: Any) -> None:
        ended = time.perf_counter()
        record(metrics, attempt, *args, **kwargs)
        entry = _pending.pop(attempt.request_id, None)
        if entry is None:
            return
        usage = attempt.usage or {}
        details = usage.get("prompt_tokens_details") or {}
        entry.update(
            request_id=attempt.request_id,
            started=attempt.started,
            sent_at=attempt.sent_at,
            first_token_at=attempt.first_token_at,
            ended=ended,
            backend=attempt.backend,
            outcome=attempt.outcome,
            cached_tokens=details.get("cached_tokens") if isinstance(details, dict) else None,
            usage_prompt_tokens=usage.get("prompt_tokens"),
        )
        out.write(orjson.dumps(entry) + b"\n")
        out.flush()

    admission.Admission.decide = traced_decide  # type: ignore[method-assign]
    forwarding.record_outcome = traced_record


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--trace":
        print(__doc__, file=sys.stderr)
        return 2
    install(argv[1])
    from spillgate.gateway.cli import main as cli_main

    return cli_main(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
