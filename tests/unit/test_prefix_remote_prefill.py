"""A prefill another gateway process announced is waited for as long as one of this process's own would be."""

from __future__ import annotations

import asyncio

from spillgate.gateway.dispatch.coalesce import REMOTE_LEAD_TTL_S, PrefillsInFlight
from spillgate.gateway.serving.forwarding import _LONGEST_HOLD_S


async def test_another_processs_prefill_queued_for_seconds_is_still_waited_for() -> None:
    """A replica with a long queue starts a prompt's prefill seconds after it was sent. Requests sharing its prefix
    that reached another process wait for word that it started, as long as the gateway ever holds a request: a
    wait that lapsed after 5 s sent them into the batch that computes the prefix, to compute it again."""
    prefills = PrefillsInFlight()
    prefills.computing_elsewhere(b"other", 1, "r0", (5, 6))
    lead, blocks = prefills.computing("r0", (5, 6), matched_blocks=2)
    assert lead is not None and blocks == 2
    await asyncio.sleep(5.2)
    assert prefills.computing("r0", (5, 6), matched_blocks=2) == (lead, 2)
    assert not lead.joinable.done(), "still queued at its replica: not given up on"
    prefills.started_elsewhere(b"other", 1)
    assert lead.joinable.done() and len(prefills) == 0


def test_an_announcement_outlasts_the_longest_hold() -> None:
    """Only a process gone without a word leaves its announcement to lapse: no live one's is given up on sooner
    than a request of this process's own is."""
    assert REMOTE_LEAD_TTL_S >= _LONGEST_HOLD_S
