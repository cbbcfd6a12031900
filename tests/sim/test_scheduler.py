"""Continuous batching in-process: admission, queueing, chunking, retraction, aborts, timing."""

from __future__ import annotations

import asyncio

import pytest

from spillgate.backends.sim import timing
from spillgate.backends.sim.config import ReplicaConfig
from spillgate.backends.sim.engine import GenerationParams
from spillgate.backends.sim.replica import Replica
from tests.sim.helpers import distinct_ids

FAST = 0.0005


async def _wait_idle(replica: Replica, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while replica.scheduler.stats().num_running_reqs or replica.scheduler.stats().num_queue_reqs:
            await asyncio.sleep(0.005)


def _exact(count: int, **fields: object) -> GenerationParams:
    return GenerationParams(max_new_tokens=count, exact_length=True, **fields)  # type: ignore[arg-type]


async def test_kv_is_returned_and_prompt_cached_after_a_request() -> None:
    replica = Replica(ReplicaConfig(preset="tiny-test", time_scale=FAST))
    prompt = distinct_ids(1000, seed=1)
    req = await replica.engine.submit(prompt, _exact(20)).result()
    assert len(req.output_ids) == 20 and req.finish_reason == {"type": "length", "length": 20}
    stats = replica.scheduler.stats()
    assert stats.num_used_tokens == 0
    assert stats.kv_evictable_tokens == 1000 + 19  # prompt + output[:-1], as cache_finished_req inserts
    again = await replica.engine.submit(prompt, _exact(5)).result()
    assert again.cached_tokens == 999  # at least one prompt token is always recomputed
    await replica.scheduler.stop()


async def test_requests_queue_when_kv_is_full_and_all_complete() -> None:
    replica = Replica(ReplicaConfig(preset="tiny-test", time_scale=FAST))
    handles = [replica.engine.submit(distinct_ids(2500, seed=i), _exact(500)) for i in range(5)]
    await asyncio.sleep(0)  # let the scheduler admit what fits
    for _ in range(100):
        await asyncio.sleep(0.001)
        if replica.scheduler.stats().num_running_reqs:
            break
    stats = replica.scheduler.stats()
    assert stats.num_running_reqs == 2 and stats.num_queue_reqs == 3
    results = await asyncio.gather(*(handle.result() for handle in handles))
    assert all(len(req.output_ids) == 500 for req in results)
    assert max(req.admitted_at for req in results) > min(req.finished_at for req in results)
    await replica.scheduler.stop()


async def test_decode_overcommit_retracts_and_still_finishes() -> None:
    replica = Replica(ReplicaConfig(preset="tiny-test", time_scale=FAST))
    handles = [replica.engine.submit(distinct_ids(1000, seed=10 + i), _exact(3000)) for i in range(3)]
    results = await asyncio.gather(*(handle.result() for handle in handles))
    assert all(len(req.output_ids) == 3000 for req in results)
    assert sum(req.num_retractions for req in results) >= 1
    assert replica.scheduler.stats().num_used_tokens == 0
    await replica.scheduler.stop()


async def test_chunked_prefill_of_a_long_prompt() -> None:
    replica = Replica(ReplicaConfig(time_scale=FAST, chunked_prefill_size=2048))
    prompt = distinct_ids(7000, seed=3)
    first = await replica.engine.submit(prompt, _exact(2)).result()
    assert first.cached_tokens == 0
    second = await replica.engine.submit(prompt, _exact(2)).result()
    assert second.cached_tokens == 6999
    assert replica.scheduler.stats().num_used_tokens == 0
    await replica.scheduler.stop()


async def test_abort_frees_kv() -> None:
    replica = Replica(ReplicaConfig(preset="tiny-test", time_scale=FAST))
    handle = replica.engine.submit(distinct_ids(3000, seed=4), _exact(4000))
    async with asyncio.timeout(5):
        while replica.scheduler.stats().num_running_reqs == 0:
            await asyncio.sleep(0.001)
    handle.close()
    await _wait_idle(replica)
    assert handle.req.finish_reason is not None and handle.req.finish_reason["type"] == "abort"
    assert replica.scheduler.stats().num_used_tokens == 0
    await replica.scheduler.stop()


async def test_flush_refuses_while_busy_then_empties_cache() -> None:
    replica = Replica(ReplicaConfig(preset="tiny-test", time_scale=FAST))
    handle = replica.engine.submit(distinct_ids(100, seed=5), _exact(300))
    await asyncio.sleep(0)
    assert not await replica.scheduler.flush_cache()
    await handle.result()
    assert replica.scheduler.stats().kv_evictable_tokens > 0
    assert await replica.scheduler.flush_cache()
    assert replica.scheduler.stats().kv_evictable_tokens == 0
    await replica.scheduler.stop()


async def test_decode_time_is_the_sum_of_simulated_steps() -> None:
    config = ReplicaConfig(time_scale=FAST)
    replica = Replica(config)
    req = await replica.engine.submit(distinct_ids(500, seed=6), _exact(50)).result()
    expected = sum(timing.decode_seconds(config.preset_spec, 1, 500 + step) for step in range(1, 50))
    assert req.finished_at is not None and req.first_token_at is not None
    assert req.finished_at - req.first_token_at == pytest.approx(expected, rel=1e-9)
    await replica.scheduler.stop()


async def test_context_length_is_enforced() -> None:
    replica = Replica(ReplicaConfig(preset="tiny-test", time_scale=FAST))
    with pytest.raises(ValueError, match="longer than the model's context length"):
        replica.engine.submit(list(range(1, 9000)), GenerationParams())
    with pytest.raises(ValueError, match="exceeds the model's maximum context length"):
        replica.engine.submit(list(range(1, 100)), _exact(8190))


async def test_max_running_requests_is_honoured() -> None:
    replica = Replica(ReplicaConfig(time_scale=FAST, max_running_requests=2))
    handles = [replica.engine.submit(distinct_ids(50, seed=20 + i), _exact(200)) for i in range(5)]
    peak = 0
    while not all(handle.req.finished for handle in handles):
        peak = max(peak, replica.scheduler.stats().num_running_reqs)
        await asyncio.sleep(0.001)
    assert peak == 2
    await replica.scheduler.stop()


async def test_page_size_aligns_cached_prefixes() -> None:
    replica = Replica(ReplicaConfig(time_scale=FAST, page_size=16))
    prompt = distinct_ids(1000, seed=30)
    await replica.engine.submit(prompt, _exact(10)).result()
    again = await replica.engine.submit(prompt, _exact(10)).result()
    assert again.cached_tokens == 992  # 999 tokens may match, rounded down to whole 16-token pages
    assert replica.scheduler.stats().num_used_tokens == 0
    await replica.scheduler.stop()


@pytest.mark.parametrize("overlap", [True, False])
async def test_the_overlap_scheduler_forms_the_next_batch_as_the_last_one_starts(overlap: bool) -> None:
    """A prompt that arrives while a long prefill runs: without overlap it is prefilled as soon as that pass ends;
    with it (SGLang's default) the batch after the long one was formed when it started, so the newcomer waits
    for that pass too (here one decode step of the long request)."""
    replica = Replica(ReplicaConfig(time_scale=0.1, disable_overlap_schedule=not overlap))
    long = replica.engine.submit(distinct_ids(8000, seed=40), _exact(50))
    await asyncio.sleep(0.005)  # the long prefill (about 0.3 simulated s, 30 ms here) is under way
    short = replica.engine.submit(distinct_ids(50, seed=41), _exact(2))
    first, second = await asyncio.gather(long.result(), short.result())
    gap = second.first_token_at - first.first_token_at
    decode_step = timing.decode_seconds(replica.config.preset_spec, 1, 8001)
    prefill_short = timing.prefill_seconds(replica.config.preset_spec, [(50, 0)])
    if overlap:
        assert gap == pytest.approx(decode_step + prefill_short, rel=0.05)
    else:
        assert gap == pytest.approx(prefill_short, rel=0.05)
    await replica.scheduler.stop()
