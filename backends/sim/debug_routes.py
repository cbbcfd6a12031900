"""The simulator's own introspection, on both faces (no real engine has these; no gateway reads them)."""

from __future__ import annotations

from fastapi import APIRouter

from spillgate.backends.sim.kv_events import split_namespace
from spillgate.backends.sim.pass_counters import PassRecord
from spillgate.backends.sim.replica import ReplicaDep
from spillgate.backends.sim.wire import OrjsonResponse

router = APIRouter()


@router.get("/sim/radix_cache")
async def radix_cache(replica: ReplicaDep) -> OrjsonResponse:
    """What the prefix cache holds: every root-to-leaf token sequence per namespace, and how many KV-event batches
    were published, so a test can hold the events to the cache once it has received them all."""
    cache = replica.scheduler.cache
    namespaces = []
    for namespace in cache.namespaces():
        extra_key, cache_salt = split_namespace(namespace)
        sequences = sorted(cache.cached_sequences(namespace))
        namespaces.append({"extra_key": extra_key, "cache_salt": cache_salt, "sequences": sequences})
    publisher = replica.kv_events
    return OrjsonResponse(
        {
            "page_size": cache.page_size,
            "total_tokens": cache.total_size,
            "kv_events_next_seq": publisher.next_seq if publisher is not None else None,
            "namespaces": namespaces,
        }
    )


@router.get("/sim/passes")
async def passes(replica: ReplicaDep) -> OrjsonResponse:
    """Where the replica's simulated time went since it started (:mod:`backends.sim.pass_counters`): prefill
    passes against decode steps, and how many running requests each prefill kept waiting; ``now`` is the
    simulated clock, so a caller reading twice can tell busy time from idle time; ``log_seq`` the latest record's
    number in ``/sim/passes/log``."""
    scheduler = replica.scheduler
    passes = scheduler.passes
    return OrjsonResponse({"now": scheduler.now(), "log_seq": passes.last_seq, **passes.to_json()})


@router.get("/sim/passes/log")
async def passes_log(replica: ReplicaDep, after: int = 0) -> OrjsonResponse:
    """The kept prefill passes, decode steps and arrivals numbered above ``after``, oldest first, as rows of
    ``seq, kind, start, duration, decoders, requests, tokens`` (:class:`backends.sim.pass_counters.PassRecord`)."""
    records = replica.scheduler.passes.records_after(after)
    return OrjsonResponse({"fields": list(PassRecord._fields), "records": [list(record) for record in records]})
