"""The simulator's pass counters (``/sim/passes``): they account for every request's time between tokens."""

from __future__ import annotations

import asyncio
import itertools

import httpx
import pytest

from spillgate.backends.sim.config import ReplicaConfig
from spillgate.backends.sim.engine import GenerationParams
from spillgate.backends.sim.radix_cache import RadixCache
from spillgate.backends.sim.replica import Replica
from tests.sim.helpers import distinct_ids, generate

FAST = 0.0005


async def test_decode_steps_and_stalling_prefills_add_up_to_every_requests_time_between_tokens() -> None:
    replica = Replica(ReplicaConfig(time_scale=FAST))
    params = GenerationParams(max_new_tokens=400, exact_length=True)
    first = replica.engine.submit(distinct_ids(3000, seed=1), params)
    updates = first.updates()
    await anext(updates)  # its first token: it decodes when the others arrive, and their prefills stall it
    later = [replica.engine.submit(distinct_ids(2000, seed=2 + i), params) for i in range(3)]
    done = await asyncio.gather(first.result(), *(handle.result() for handle in later))
    await updates.aclose()
    passes = replica.scheduler.passes

    between_tokens = sum(req.finished_at - req.first_token_at for req in done)
    accounted = passes.decode_token_s + passes.stalled_decoder_s + passes.late_decoder_s
    assert accounted == pytest.approx(between_tokens, rel=1e-9)
    assert passes.decode_tokens == sum(len(req.output_ids) - 1 for req in done)
    assert passes.prefill_tokens == 3000 + 3 * 2000
    assert passes.stalled_decoder_s > 0  # some prefill ran while a request waited to decode
    assert passes.prefill_idle_decoders_s > 0  # the first prefill had no one to stall
    assert passes.prefill_passes >= 2 and passes.prefill_requests == 4
    assert passes.decode_context_tokens > passes.decode_tokens * 2000
    # the first arrived to an empty replica; each later one found the first decoding and those before it queued
    assert (passes.arrivals, passes.decoders_at_arrival, passes.waiting_at_arrival) == (4, 3, 0 + 1 + 2)
    log = passes.records_after(0)
    kinds = [record.kind for record in log]
    assert kinds.count("arrival") == 4 and kinds.count("prefill") == passes.prefill_passes
    assert kinds.count("decode") == passes.decode_passes
    stalled = sum(r.duration * r.decoders for r in log if r.kind == "prefill")
    assert stalled == pytest.approx(passes.stalled_decoder_s)
    passes_only = [r for r in log if r.kind != "arrival"]
    assert all(a.start + a.duration <= b.start + 1e-12 for a, b in itertools.pairwise(passes_only))
    assert passes.records_after(log[-2].seq) == [log[-1]]
    await replica.scheduler.stop()


def test_the_route_serves_the_counters_and_they_grow_with_work(client: httpx.Client) -> None:
    before = client.get("/sim/passes").json()
    generate(client, distinct_ids(500, seed=77), max_new_tokens=5)
    after = client.get("/sim/passes").json()
    assert after["prefill_tokens"] - before["prefill_tokens"] >= 499  # the health check may add its own
    assert after["decode_tokens"] - before["decode_tokens"] >= 4
    assert after["now"] > before["now"]
    busy = after["prefill_s"] + after["decode_s"] - before["prefill_s"] - before["decode_s"]
    assert 0 < busy <= after["now"] - before["now"]
    log = client.get("/sim/passes/log", params={"after": before["log_seq"]}).json()
    assert log["records"][-1][0] == after["log_seq"]
    assert log["fields"] == ["seq", "kind", "start", "duration", "decoders", "requests", "tokens"]
    kinds = {row[1] for row in log["records"]}
    assert {"arrival", "prefill", "decode"} <= kinds


def test_looking_up_what_is_cached_changes_nothing_that_eviction_sees() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3, 4])
    cache.insert([5, 6, 7, 8])
    assert cache.cached_len([1, 2, 3, 9]) == 3  # inside an edge: not split
    assert cache.cached_len([1, 2, 3, 4, 5]) == 4 and cache.cached_len([9]) == 0
    assert cache.cached_len([1, 2], namespace="other") == 0
    assert sorted(cache.cached_sequences()) == [[1, 2, 3, 4], [5, 6, 7, 8]]
    cache.evict(4)  # the least recently used leaf still goes first: the lookup refreshed nothing
    assert cache.cached_sequences() == [[5, 6, 7, 8]]


async def test_what_a_request_found_cached_on_arrival_and_on_admission() -> None:
    replica = Replica(ReplicaConfig(time_scale=FAST))
    prompt = distinct_ids(2000, seed=40)
    params = GenerationParams(max_new_tokens=4, exact_length=True)
    await replica.engine.submit(prompt, params).result()
    passes = replica.scheduler.passes
    assert (passes.cached_at_arrival, passes.cached_at_admission) == (0, 0)
    await replica.engine.submit([*prompt, 7, 7, 7], params).result()
    assert passes.cached_at_arrival == passes.cached_at_admission == 2000
    await replica.scheduler.stop()
