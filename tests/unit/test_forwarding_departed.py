"""A replica that leaves the catalog while a request waits for it gets nothing: the request goes elsewhere.

The gateway's real state and forwarder; only the upstream is a recorder, since what matters is where a request
would have been sent (a departed pod's address may already be another pod's, which must not get the pool's key).
"""

from __future__ import annotations

import asyncio
from typing import Any

from spillgate.gateway.control.config import parse_config
from spillgate.gateway.dispatch.prefix import Fingerprint
from spillgate.gateway.errors import ApiError
from spillgate.gateway.observability.tracing import Tracing
from spillgate.gateway.serving.admission import Admitted
from spillgate.gateway.serving.exchange import Attempt, TryElsewhere
from spillgate.gateway.serving.forwarding import Forwarder
from spillgate.gateway.serving.upstream import UpstreamCall
from spillgate.gateway.serving.validation import ParsedRequest
from spillgate.gateway.state import GatewayState, build_state
from spillgate.policies.types import Decision
from tests.support.gateway import replica_name

CLOSED = ("http://127.0.0.1:9", "http://127.0.0.2:9")
"""Nothing is sent anywhere: the recorder stands in for the upstream."""
FIRST, SECOND = (replica_name(url) for url in CLOSED)
BLOCKS = 64


class Recorder:
    """Where each attempt would have gone; fails at the backends named in ``failing``."""

    follows_prefill = True

    def __init__(self, failing: tuple[str, ...] = ()) -> None:
        self.sent: list[str] = []
        self._failing = failing

    async def serve(self, call: UpstreamCall) -> str:
        name = call.ticket.backend.name
        self.sent.append(name)
        if name in self._failing:
            raise TryElsewhere(
                ApiError(502, "The backend could not be reached.", code="backend_connect"), retryable=True
            )
        return "ok"


def gateway(backoff_s: float = 0.0) -> GatewayState:
    pool = {"name": "pool", "served_model": "m", "replicas": list(CLOSED), "max_waiting_prefill_tokens": 1}
    raw: dict[str, Any] = {
        "pools": [pool],
        "routes": [{"name": "chat", "targets": ["pool"]}],
        "auth": {"required": False},
        "health": {"interval_s": 60},
        "outlier": {"retry_backoff_s": backoff_s},
    }
    config = parse_config(raw)
    return build_state(config, {}, {})


def request(fingerprint: Fingerprint | None = None) -> tuple[Admitted, Attempt]:
    """A streamed request ranked the first replica then the second; with ``fingerprint``, its whole prefix believed
    at the first."""
    payload = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    parsed = ParsedRequest(payload, "chat", stream=True, include_usage=False, max_tokens=8, prompt_tokens=BLOCKS * 64)
    decision = Decision(FIRST, "least_load", ranked=(FIRST, SECOND))
    attempt = Attempt(request_id="r", started=0.0, route="chat", stream=True, fingerprint=fingerprint)
    attempt.matched_blocks = {FIRST: len(fingerprint.hashes)} if fingerprint is not None else {}
    return Admitted(parsed, decision, None), attempt


async def discard(_message: object) -> None:
    pass


def leave(state: GatewayState, name: str) -> None:
    """The replica leaves the catalog, as a config edit or discovery makes it."""
    state.registry.replace([backend for backend in state.registry if backend.name != name])


async def test_a_replica_that_left_while_a_request_waited_for_its_shared_prefill_gets_nothing() -> None:
    state = gateway()
    recorder = Recorder()
    forwarder = Forwarder(state, "/v1/chat/completions", {"replica": recorder}, Tracing.from_environment())
    hashes = tuple(range(1, BLOCKS + 1))
    prefilling = state.dispatcher.prefilling
    blocker = prefilling.sent(FIRST, (0,), cached_blocks=0, tokens=6000)  # the first is busy prefilling it
    prefilling.sent(FIRST, hashes, cached_blocks=0, tokens=BLOCKS * 64)  # computes the prefix, next batch
    admitted, attempt = request(Fingerprint(hashes=hashes, prefix_key=1, length=BLOCKS * 64))
    first = state.registry[FIRST]
    assert state.dispatcher.shared_prefill(first, attempt.fingerprint, attempt.matched_blocks) is not None

    forwarding = asyncio.create_task(forwarder._try_candidates(admitted, attempt, discard))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not forwarding.done() and recorder.sent == [], "held for the prefill the first is computing"
    leave(state, FIRST)
    prefilling.ended(blocker)  # the prefix's prefill starts: the wait is over
    assert await asyncio.wait_for(forwarding, 30) == "ok"
    assert recorder.sent == [SECOND], "the departed replica was not sent the request"
    assert attempt.backend == SECOND and attempt.reason == "fallback"


async def test_a_replica_that_left_while_a_prompt_was_held_for_room_there_gets_nothing() -> None:
    state = gateway()
    recorder = Recorder()
    forwarder = Forwarder(state, "/v1/chat/completions", {"replica": recorder}, Tracing.from_environment())
    prefilling = state.dispatcher.prefilling
    blocker = prefilling.sent(FIRST, (0,), cached_blocks=0, tokens=6000)
    prefilling.sent(FIRST, (1,), cached_blocks=0, tokens=6000, hold_beyond=1)  # waits unscheduled behind it
    admitted, attempt = request()

    forwarding = asyncio.create_task(forwarder._try_candidates(admitted, attempt, discard))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not forwarding.done() and recorder.sent == [], "held while a prompt waits unscheduled at the first"
    leave(state, FIRST)
    prefilling.ended(blocker)  # the waiting prompt is scheduled: room for the held one
    assert await asyncio.wait_for(forwarding, 30) == "ok"
    assert recorder.sent == [SECOND], "the departed replica was not sent the request"


async def test_a_replica_that_left_during_the_retry_backoff_gets_nothing() -> None:
    state = gateway(backoff_s=0.05)
    recorder = Recorder(failing=(FIRST,))
    forwarder = Forwarder(state, "/v1/chat/completions", {"replica": recorder}, Tracing.from_environment())
    admitted, attempt = request()

    forwarding = asyncio.create_task(forwarder._try_candidates(admitted, attempt, discard))
    while not recorder.sent:
        await asyncio.sleep(0)
    leave(state, SECOND)  # after the check of its health, while the fallback waits out its backoff
    assert await asyncio.wait_for(forwarding, 30) == "error"
    assert recorder.sent == [FIRST], "the departed replica was not sent the request"
