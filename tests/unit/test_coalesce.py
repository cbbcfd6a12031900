"""Which prefix blocks a replica is computing, and when the request computing them has started."""

from __future__ import annotations

import asyncio
import time

from spillgate.gateway.dispatch.coalesce import DEFAULT_BATCH_TOKENS, PrefillsInFlight, hold_limit


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


async def test_with_the_overlap_scheduler_a_prefix_is_joinable_one_pass_after_its_batch_forms() -> None:
    """SGLang's overlap scheduler forms the next batch as a batch starts: a request sent when the prefix's batch
    forms would join the batch formed during it, before the prefix is cached."""
    prefills = PrefillsInFlight()
    running = prefills.sent("r0", (1,), 0, tokens=6000, overlap=True)
    assert running.joinable.done(), "an idle replica forms its next batch at once, before anyone else arrives"
    lead = prefills.sent("r0", (2, 3), 0, tokens=3000, overlap=True)
    plain = prefills.sent("r1", (1,), 0, tokens=6000)
    follower = prefills.sent("r1", (2, 3), 0, tokens=3000)
    prefills.ended(running)
    prefills.ended(plain)
    assert lead.started.done() and not lead.joinable.done(), "its batch formed; the one formed next has too"
    assert follower.joinable.done(), "without overlap the next batch forms after this one's results"
    prefills.progressed("r1")
    assert not lead.joinable.done(), "a token from another replica says nothing"
    prefills.progressed("r0")
    assert lead.joinable.done(), "its batch has begun: the batch formed now comes after it"
    prefills.ended(lead)
    prefills.ended(follower)
    assert len(prefills) == 0


async def test_prompts_wait_at_the_gateway_while_their_replica_has_enough_waiting() -> None:
    """Past ``hold_beyond`` tokens waiting unscheduled, new prompts are held in order and go as batches form;
    a cheap prompt (a prefix hit) is never held."""
    prefills = PrefillsInFlight()
    running = prefills.sent("r0", (1,), 0, tokens=6000, batch_tokens=8192, hold_beyond=4096)
    second = prefills.sent("r0", (2,), 0, tokens=3000, batch_tokens=8192, hold_beyond=4096)
    third = prefills.sent("r0", (3,), 0, tokens=3000, batch_tokens=8192, hold_beyond=4096)
    assert running.released is None and second.released is None and third.released is None, "3,000 < 4,096"
    fourth = prefills.sent("r0", (4,), 0, tokens=3000, batch_tokens=8192, hold_beyond=4096)
    hit = prefills.sent("r0", (5,), 0, tokens=100, batch_tokens=8192, hold_beyond=4096)
    fifth = prefills.sent("r0", (6,), 0, tokens=600, batch_tokens=8192, hold_beyond=4096)
    assert fourth.released is not None and not fourth.released.done(), "6,000 tokens wait already"
    assert hit.released is None, "a prompt of fewer than MIN_HELD_TOKENS new tokens goes at once"
    assert fifth.released is not None and not fifth.released.done(), "held prompts keep their order"
    assert prefills.held("r0") == (3600, 2)
    assert prefills.sent("r1", (4,), 0, tokens=3000, hold_beyond=4096).released is None, "r1 is idle"

    prefills.ended(running)
    assert second.started.done() and third.started.done() and hit.started.done(), "the next batch forms"
    assert fourth.released.done() and fifth.released.done(), "nothing waits unscheduled: both go"
    assert not fourth.started.done() and not fifth.started.done(), "they wait for the batch after"
    assert prefills.held("r0") == (0, 0)


async def test_a_prompt_whose_replica_holds_a_quarter_of_its_prefix_is_never_held() -> None:
    """Held, a warm prompt would wait while cold prompts' prefills push its prefix out of the cache."""
    prefills = PrefillsInFlight()
    prefills.sent("r0", (1,), 0, tokens=6000, hold_beyond=1)
    prefills.sent("r0", (2,), 0, tokens=3000, hold_beyond=1)
    cold = prefills.sent("r0", (3, 4, 5, 6, 7), cached_blocks=1, tokens=3000, hold_beyond=1)
    warm = prefills.sent("r0", (8, 9, 10, 11), cached_blocks=1, tokens=3000, hold_beyond=1)
    assert cold.released is not None and not cold.released.done(), "1 block of 5 held there: it waits"
    assert warm.released is None, "1 block of 4 held there: it goes at once, ahead of held cold prompts"


async def test_a_held_prompt_whose_client_leaves_frees_its_place_and_its_waiters() -> None:
    prefills = PrefillsInFlight()
    prefills.sent("r0", (1,), 0, tokens=6000, hold_beyond=1)
    waiting = prefills.sent("r0", (2,), 0, tokens=3000, hold_beyond=1)
    gone = prefills.sent("r0", (3, 4), 0, tokens=3000, hold_beyond=1)
    after = prefills.sent("r0", (5,), 0, tokens=3000, hold_beyond=1)
    assert waiting.released is None and gone.released is not None and after.released is not None
    assert prefills.computing("r0", (3, 4), 2) == (gone, 2), "a held prompt's prefix is still its to compute"
    prefills.ended(gone)
    assert gone.started.done(), "requests sharing its prefix stop waiting for it"
    assert prefills.computing("r0", (3, 4), 2) == (None, 0)
    assert prefills.held("r0") == (3000, 1), "only the prompt behind it is held now"
    prefills.send_now(after)
    assert after.released.done() and prefills.held("r0") == (0, 0), "a prompt held too long goes anyway"


def test_the_hold_limit_defaults_to_an_eighth_of_a_prefill_batch() -> None:
    assert hold_limit(None, 8192) == 1024
    assert hold_limit(None, 0) == DEFAULT_BATCH_TOKENS // 8, "a replica that does not say its batch size"
    assert hold_limit(0, 8192) == 0, "0 never holds"
    assert hold_limit(2000, 8192) == 2000


async def test_the_batch_in_progress_is_what_predictions_count_as_being_computed() -> None:
    """``running``: the tokens of the batch a replica is computing and when it started; the requests still
    waiting, and the batch-mates whose first tokens are due, are told apart."""
    prefills = PrefillsInFlight()
    assert prefills.running("r0") == (0, 0.0), "nothing sent"
    before = time.monotonic()
    first = prefills.sent("r0", (1,), 0, tokens=6000, batch_tokens=8192)
    tokens, since = prefills.running("r0")
    assert tokens == 6000 and before <= since <= time.monotonic(), "an idle replica starts at once"
    waiting = [prefills.sent("r0", (10 + i,), 0, tokens=3000, batch_tokens=8192) for i in range(3)]
    assert prefills.running("r0") == (6000, since), "the others wait for the next batch"
    prefills.ended(first)
    tokens, next_since = prefills.running("r0")
    assert tokens == 9000 and next_since >= since, "3,000 + 3,000 + 3,000 crosses 8,192: all three go"
    prefills.ended(waiting[0])
    assert prefills.running("r0") == (6000, next_since), "the batch-mates' first tokens are due, its start stays"
    prefills.ended(waiting[1])
    prefills.ended(waiting[2])
    assert prefills.running("r0")[0] == 0


async def test_another_process_prefill_is_waited_for_until_it_starts() -> None:
    prefills = PrefillsInFlight()
    prefills.computing_elsewhere(b"other", 1, "r0", (2, 3))
    local = prefills.sent("r0", (1, 2, 3, 4), cached_blocks=3, tokens=100)
    lead, blocks = prefills.computing("r0", (1, 2, 3, 4), matched_blocks=3)
    assert lead is not None and lead is not local and blocks == 2 and not lead.started.done()
    prefills.started_elsewhere(b"other", 1)
    assert lead.started.done()
    assert prefills.computing("r0", (1, 2, 3), matched_blocks=3) == (None, 0)
    assert prefills.computing("r0", (1, 2, 3, 4), matched_blocks=4) == (local, 1), "this process's block stays"
    prefills.started_elsewhere(b"other", 1)  # a repeated or unknown notice is ignored
    prefills.ended(local)


async def test_a_local_prefill_keeps_its_blocks_when_another_process_announces_them() -> None:
    prefills = PrefillsInFlight()
    local = prefills.sent("r0", (1, 2), cached_blocks=0, tokens=100)
    prefills.computing_elsewhere(b"other", 7, "r0", (1, 2))
    assert prefills.computing("r0", (1, 2), matched_blocks=2) == (local, 2)
    prefills.started_elsewhere(b"other", 7)
    assert prefills.computing("r0", (1, 2), matched_blocks=2) == (local, 2)


async def test_a_prefill_never_said_to_start_lapses_and_releases_its_waiters() -> None:
    """The process that announced it may have died: its announcement lapses on a timer, and the requests waiting
    for it go, though nothing else happens."""
    prefills = PrefillsInFlight(remote_ttl_s=0.05)
    prefills.computing_elsewhere(b"gone", 1, "r0", (5, 6))
    lead, _ = prefills.computing("r0", (5, 6), matched_blocks=2)
    assert lead is not None and not lead.started.done()
    await asyncio.sleep(0.03)
    prefills.computing_elsewhere(b"alive", 1, "r1", (9,))
    await asyncio.wait_for(lead.started, 1)
    assert prefills.computing("r0", (5, 6), matched_blocks=2) == (None, 0)
    later, _ = prefills.computing("r1", (9,), matched_blocks=1)
    assert later is not None and not later.started.done(), "announced later, it lapses later"
    await asyncio.wait_for(later.started, 1)
    assert len(prefills) == 0


async def test_a_stopped_process_is_not_waited_for() -> None:
    prefills = PrefillsInFlight()
    prefills.computing_elsewhere(b"stopped", 1, "r0", (1,))
    prefills.computing_elsewhere(b"running", 1, "r0", (2,))
    prefills.forget_elsewhere(b"stopped")
    assert prefills.computing("r0", (1,), 1) == (None, 0)
    assert prefills.computing("r0", (2,), 1)[0] is not None
    prefills.forget_elsewhere()
    assert len(prefills) == 0
