"""Which data-parallel rank of a replica a request goes to, once the replica is chosen.

A data-parallel replica keeps one KV cache per rank, and a request reuses only the cache of the rank that serves
it: the rank holding the longest prefix of the prompt saves the most prefill. Among ranks holding as much, the one
with the fewest requests this gateway has outstanding there; among those, the next in turn, so that ranks holding
nothing of a new prompt share new prompts as the engines' own round robin would.
"""

from __future__ import annotations

from collections.abc import Sequence


def choose_rank(depths: Sequence[int], outstanding: Sequence[int], turn: int) -> int:
    """The rank for a request: ``depths[r]`` is how many leading blocks of its prompt rank r holds,
    ``outstanding[r]`` the gateway's requests in flight there, ``turn`` the rank to prefer first among equals
    (the caller moves it past each rank chosen)."""
    count = len(depths)
    best: int | None = None
    for offset in range(count):
        rank = (turn + offset) % count
        if best is None or (depths[rank], -outstanding[rank]) > (depths[best], -outstanding[best]):
            best = rank
    assert best is not None, "a replica has at least one rank"
    return best
