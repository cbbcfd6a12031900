"""Which prefix blocks a replica is computing, and when the request computing them has started."""

from __future__ import annotations

from gateway.coalesce import PrefillsInFlight


async def test_a_shared_prefix_is_computed_by_the_first_request_sent() -> None:
    prefills = PrefillsInFlight()
    first = prefills.sent("r0", (1, 2, 3, 4), cached_blocks=1)
    assert first.hashes == (2, 3, 4)
    second = prefills.sent("r0", (1, 2, 3, 9), cached_blocks=3)
    lead, blocks = prefills.computing("r0", (1, 2, 3, 9), matched_blocks=3)
    assert lead is first and blocks == 2, "blocks 2 and 3 are the first request's; block 1 was cached"
    assert prefills.computing("r1", (1, 2, 3, 9), matched_blocks=3) == (None, 0), "another replica holds nothing"
    assert prefills.computing("r0", (1, 2, 3, 9), matched_blocks=1) == (None, 0), "block 1 is cached already"
    prefills.ended(first)
    assert prefills.computing("r0", (1, 2, 3, 9), matched_blocks=3) == (None, 0)
    assert prefills.computing("r0", (1, 2, 3, 9, 5), matched_blocks=4) == (second, 1)


async def test_a_prefill_starts_once_every_request_sent_before_it_has_ended() -> None:
    prefills = PrefillsInFlight()
    ahead = [prefills.sent("r0", (10 + i,), 0) for i in range(2)]
    assert ahead[0].started.done(), "an idle replica starts at once"
    lead = prefills.sent("r0", (7, 8), 0)
    other_replica = prefills.sent("r1", (7, 8), 0)
    assert other_replica.started.done() and not lead.started.done()
    prefills.ended(ahead[0])
    assert not lead.started.done()
    prefills.ended(ahead[1])
    assert lead.started.done()
    prefills.ended(lead)
    prefills.ended(other_replica)
    assert len(prefills) == 0, "nothing is held once every prefill has ended"


async def test_a_failure_out_of_order_releases_its_waiters() -> None:
    prefills = PrefillsInFlight()
    prefills.sent("r0", (1,), 0)
    failed = prefills.sent("r0", (2, 3), 0)
    assert not failed.started.done()
    prefills.ended(failed)
    assert failed.started.done(), "nobody may wait for a request that will never start"
    assert prefills.computing("r0", (2, 3), 2) == (None, 0)
