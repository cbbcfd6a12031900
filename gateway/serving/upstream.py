"""What every kind of backend does for the forwarding loop: serve one attempt, relayed to the client.

A self-hosted replica (:mod:`gateway.serving.replica`) and a hosted model (:mod:`gateway.serving.hosted`) each
implement :class:`Upstream`; the forwarding loop (:mod:`gateway.serving.forwarding`) calls ``serve`` on each
ranked candidate without asking which it holds. ``serve`` either relays an answer (returning the outcome) or,
when it failed before the client saw a byte, raises :class:`~gateway.serving.exchange.TryElsewhere`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from spillgate.gateway.dispatch.ticket import DispatchTicket
from spillgate.gateway.serving.exchange import Attempt, Send
from spillgate.gateway.serving.validation import ParsedRequest


@dataclass(slots=True)
class UpstreamCall:
    """One attempt of one request, as an upstream serves it."""

    parsed: ParsedRequest
    attempt: Attempt
    ticket: DispatchTicket
    """The attempt's load on its backend (``ticket.backend``): told the first token, the text, the end."""
    send: Send
    path: str
    """Where an OpenAI-compatible server takes this endpoint (``/v1/chat/completions``...)."""


class Upstream(Protocol):
    follows_prefill: bool
    """Whether the gateway follows a streamed prompt's prefill there (its first token ends it), which lets
    it hold prompts back and have requests that share a prefix wait for it (:mod:`gateway.dispatch.coalesce`)."""

    async def serve(self, call: UpstreamCall) -> str:
        """Send the attempt and relay its answer; returns the outcome (``ok``, ``error``, ``client_error``)."""
        ...
