"""What the best placement could have done with a run's requests: a TTFT reference, not a router.

The run's own requests, at the times it sent them, each finding as much of its prompt cached as the best
achievable reference found (one replica holding everything), are prefilled one request per pass on whichever
of the replicas frees first (one queue, in arrival order), each pass taking the simulator's roofline compute
time for that prefill and nothing else.

Optimistic on purpose, so that it is a floor: every prefix is on every replica at no cost, no decode step,
pass overhead or batch ever delays a prefill, and the router knows to the microsecond when each replica frees.
No router that forwards requests in the order they come can beat it. The distance from a router's TTFT p99
down to it is shared by placement, the replicas' own batching and decode steps, and the prefill a prefix
costs wherever it moves. A TTFT goal below it asks for what no placement can give.

:func:`sticky_ttfts` is the same reference with one rule added: a conversation's turns stay on the replica
its first turn went to, as they must for the turn to find its history cached there. Its distance from
:func:`ideal_ttfts` is what keeping conversations home costs in queueing. First turns still go wherever frees
first, which a router that foresaw the turns to come could improve on: a reference, not a strict floor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spillgate.backends.sim import timing
from spillgate.backends.sim.presets import Preset


@dataclass(frozen=True, slots=True)
class IdealRequest:
    arrival_s: float
    """Simulated seconds from the run's start."""
    prompt_tokens: int
    cached_tokens: int
    """The most of the prompt any placement could find cached: the best achievable reference's count."""
    session: int | None = None
    """The conversation a chat turn belongs to; ``None`` for an independent request."""


def ideal_ttfts(requests: Sequence[IdealRequest], replicas: int, preset: Preset) -> list[float]:
    """Each request's TTFT in simulated seconds under the ideal placement, in the order given."""
    return _placed_ttfts(requests, replicas, preset, keep_sessions_home=False)


def sticky_ttfts(requests: Sequence[IdealRequest], replicas: int, preset: Preset) -> list[float]:
    """:func:`ideal_ttfts` with each session's later turns on the replica its first turn went to."""
    return _placed_ttfts(requests, replicas, preset, keep_sessions_home=True)


def replayed_ttfts(
    requests: Sequence[IdealRequest], replicas: int, preset: Preset, first_replicas: Sequence[int]
) -> list[float]:
    """:func:`sticky_ttfts` with each session's first turn (and each independent request) on the replica a
    run sent it to, ``first_replicas[i]`` for ``requests[i]``: how much of that run's tail its own placement
    of new conversations set, in the same timing model as the greedy reference."""
    return _placed_ttfts(requests, replicas, preset, keep_sessions_home=True, chosen=first_replicas)


def _placed_ttfts(
    requests: Sequence[IdealRequest],
    replicas: int,
    preset: Preset,
    *,
    keep_sessions_home: bool,
    chosen: Sequence[int] | None = None,
) -> list[float]:
    free_at = [0.0] * replicas
    home: dict[int, int] = {}
    ttfts = [0.0] * len(requests)
    for index in sorted(range(len(requests)), key=lambda i: requests[i].arrival_s):
        request = requests[index]
        replica = home.get(request.session) if keep_sessions_home and request.session is not None else None
        if replica is None:
            # Where the run put it, or the first replica to free.
            replica = chosen[index] if chosen is not None else min(range(replicas), key=free_at.__getitem__)
            if keep_sessions_home and request.session is not None:
                home[request.session] = replica
        start = max(request.arrival_s, free_at[replica])
        uncached = max(0, request.prompt_tokens - request.cached_tokens)
        free_at[replica] = start + timing.prefill_compute_seconds(preset, uncached, request.prompt_tokens - uncached)
        ttfts[index] = free_at[replica] - request.arrival_s
    return ttfts
