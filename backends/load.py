"""The load the gateway puts on a backend, in two records with one writer each.

:class:`OwnLoad` is this process's requests there: written only by the dispatch ticket
(:mod:`gateway.dispatch.ticket`), which books a request when it is sent and settles it when it ends, whatever
the ending. :class:`PeersLoad` is what the other gateway processes last said of theirs: written only by
:mod:`gateway.dispatch.peer_load`. Everything else (the registry's snapshots, ``/health``, the dashboard)
reads them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class OwnLoad:
    """This process's requests on one backend."""

    in_flight: int = 0
    sent_total: int = 0
    """Requests sent here, a running total: a scrape counts every one that may have been running while the
    replica answered it, as ours."""
    outstanding_tokens: int = 0
    """Output tokens booked and not yet generated (a request's ``max_tokens``, or an assumed length)."""
    pending_prefill_tokens: int = 0
    """Uncached prompt tokens of requests whose first token has not come back."""
    running_prefill_tokens: int = 0
    """Of ``pending_prefill_tokens``, those of the prefill batch in progress here
    (:mod:`gateway.dispatch.coalesce`)..."""
    running_prefill_since: float = 0.0
    """...which started then (``time.monotonic``): what it has computed since is counted as done."""
    prefilled_tokens: int = 0
    """Uncached prompt tokens of streamed requests whose first token came back: a running total the other
    gateway processes read (:mod:`gateway.dispatch.peer_load`)."""
    last_first_token_at: float = 0.0
    """When the latest first token of a streamed request came back from here (``perf_counter``)."""
    peers_prefilled_at_first_token: int = 0
    """``PeersLoad.prefilled_tokens`` when that first token came back."""


@dataclass(slots=True)
class PeersLoad:
    """The other gateway processes' requests on one backend, as they last said."""

    in_flight: int = 0
    pending_prefill_tokens: int = 0
    """Their uncached prompt tokens not yet past the first token..."""
    outstanding_tokens: int = 0
    """...their output tokens still to come..."""
    prefilled_tokens: int = 0
    """...and the uncached prompt tokens their requests here have had prefilled, a running total."""
