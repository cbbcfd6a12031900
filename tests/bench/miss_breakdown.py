"""Why requests missed the cache, from the gateway traces of ``compare_kv_events --trace-dir`` runs.

    .venv/bin/python -m tests.bench.miss_breakdown DIR/*-gateway.jsonl

A request *missed* when the replica reported under half its prompt cached. Each miss is put in one class by
what the routing decision saw (the ``prefix_tokens`` of every replica in its trace entry):

- ``cold``: no replica was predicted to hold half the prompt (a new prefix, or one evicted everywhere);
- ``moved``: one was, and the request went elsewhere (the affinity guard or the load);
- ``lost``: the chosen replica was predicted to hold it and did not by the prefill (evicted while the request
  waited, or still being computed for another request).

Runs of one row (the file name without its ``-seedN-gateway.jsonl``) are pooled.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

import orjson

MISS_SHARE = 0.5
"""A request missed when under this share of its prompt was cached."""

CLASSES = ("cold", "moved", "lost")


def miss_class(entry: dict) -> str | None:
    """The class of one decision's miss (:data:`CLASSES`), or None if it hit."""
    prompt = entry["prompt_tokens"]
    if (entry.get("cached_tokens") or 0) >= MISS_SHARE * prompt:
        return None
    predicted = {backend["name"]: backend.get("prefix_tokens", 0) for backend in entry["backends"]}
    if max(predicted.values(), default=0) < MISS_SHARE * prompt:
        return "cold"
    return "lost" if predicted.get(entry["chosen"], 0) >= MISS_SHARE * prompt else "moved"


def row_of(path: Path) -> str:
    return re.sub(r"(-seed\d+)?-gateway\.jsonl$", "", path.name)


def breakdown(entries: Iterable[dict]) -> tuple[int, float, Counter[str]]:
    """Requests, the share of prompt tokens cached, and the misses by class."""
    requests, cached, prompt, misses = 0, 0, 0, Counter[str]()
    for entry in entries:
        requests += 1
        cached += entry.get("cached_tokens") or 0
        prompt += entry["prompt_tokens"]
        kind = miss_class(entry)
        if kind is not None:
            misses[kind] += 1
    return requests, cached / prompt if prompt else 0.0, misses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", type=Path, nargs="+", help="gateway traces (*-gateway.jsonl)")
    args = parser.parse_args()
    rows: dict[str, list[dict]] = defaultdict(list)
    for path in args.traces:
        rows[row_of(path)].extend(orjson.loads(line) for line in path.read_bytes().splitlines() if line)
    print("| row | requests | cached | " + " | ".join(f"{kind} misses" for kind in CLASSES) + " |")
    print("| --- " * (3 + len(CLASSES)) + "|")
    for row, entries in sorted(rows.items()):
        requests, share, misses = breakdown(entries)
        counts = " | ".join(str(misses[kind]) for kind in CLASSES)
        print(f"| {row} | {requests} | {share:.1%} | {counts} |")


if __name__ == "__main__":
    main()
