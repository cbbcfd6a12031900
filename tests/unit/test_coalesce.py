"""Which prefix blocks a replica is computing, and when the request computing them has started."""

from __future__ import annotations

from gateway.coalesce import PrefillsInFlight


async def test_a_shared_prefix_is_computed_by_the_first_request_sent() -> None:
    prefills = PrefillsInFlight()
    first = prefills.sent("r0", (1, 2, 3, 4), cached_blocks=1, tokens=300)
    assert first.hashes == (2, 3, 4)
    second = prefills.sent("r0", (1, 2, 3, 9), cached_blocks=3, tokens=100)
    lead, blocks = prefills.computing("r0", (1, 2, 3, 9), matched_blocks=3)
    assert lead is first and blocks == 2, "blocks 2 and 3 are the first request's; block 1 was cached"
    assert prefills.computing("r1", (1, 2, 3, 9), matched_blocks=3) == (None, 0), "another replica holds nothing"
    assert prefills.computing("r0", (1, 2, 3, 9), matched_blocks=1) == (None, 0), "block 1 is cached already"
    prefills.ended(first)
    assert prefills.computing("r0", (1, 2, 3, 9), matched_blocks=3) == (None, 0)
    assert prefills.computing("r0", (1, 2, 3, 9, 5), matched_blocks=4) == (second, 1)


async def test_the_next_batch_takes_the_waiting_requests_in_order_up_to_its_budget() -> None:
    """SGLang's FCFS scheduler: when a batch ends, the next takes waiting requests until its token budget is
    spent; the request crossing the budget is chunked into it, the ones after wait for another batch."""
    prefills = PrefillsInFlight()
    running = prefills.sent("r0", (1,), 0, tokens=6000, batch_tokens=8192)
    assert running.started.done(), "an idle replica starts at once"
    waiting = [prefills.sent("r0", (10 + i,), 0, tokens=5000, batch_tokens=8192) for i in range(3)]
    elsewhere = prefills.sent("r1", (10,), 0, tokens=5000)
    assert elsewhere.started.done() and not any(lead.started.done() for lead in waiting)
    prefills.ended(running)
    assert [lead.started.done() for lead in waiting] == [True, True, False], "5,000 + 5,000 crosses 8,192"
    prefills.ended(waiting[0])
    assert not waiting[2].started.done(), "its batch has not ended: the second request's first token is due"
    prefills.ended(waiting[1])
    assert waiting[2].started.done()
    prefills.ended(waiting[2])
    prefills.ended(elsewhere)
    assert len(prefills) == 0, "nothing is held once every prefill has ended"


async def test_a_failure_releases_its_waiters() -> None:
    prefills = PrefillsInFlight()
    prefills.sent("r0", (1,), 0, tokens=9000)
    failed = prefills.sent("r0", (2, 3), 0, tokens=100)
    assert not failed.started.done()
    prefills.ended(failed)
    assert failed.started.done(), "nobody may wait for a request that will never start"
    assert prefills.computing("r0", (2, 3), 2) == (None, 0)
