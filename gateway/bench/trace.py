"""Mooncake-format traces: read the records and turn their ``hash_ids`` into prompts with exactly that sharing.

A record is ``{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [...]}``;
each id names one 512-token block, and ids are prefix-chained (an id fixes the block *and* everything before
it). Block text is derived from the id alone, so two records whose ``hash_ids`` agree on their first k ids
send the same first k blocks of text and different text after, which is the sharing a prefix cache sees.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from spillgate.gateway.bench import text

BLOCK_TOKENS = 512
_CACHED_BLOCKS = 4096  # whole blocks kept as text (~2 KiB each): a hot prefix is built once, not per request


@dataclass(frozen=True, slots=True)
class TraceRecord:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


class TraceError(ValueError):
    """The trace file is missing, empty or has a malformed line (the message names the line)."""


def load_trace(path: Path | str) -> list[TraceRecord]:
    """All records of a JSONL trace, in file order (Mooncake traces are sorted by timestamp)."""
    records = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            records.append(
                TraceRecord(
                    timestamp_ms=float(row.get("timestamp", 0)),
                    input_length=int(row["input_length"]),
                    output_length=int(row["output_length"]),
                    hash_ids=tuple(int(block) for block in row.get("hash_ids", ())),
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise TraceError(f"{path}:{number}: not a Mooncake trace record ({exc!r})") from exc
    if not records:
        raise TraceError(f"{path}: no records")
    return records


def scaled(records: list[TraceRecord], block_tokens: int, max_output: int | None = None) -> list[TraceRecord]:
    """The records with ``block_tokens``-token blocks instead of 512 (every prompt shrunk alike, the blocks it
    shares with others the same) and outputs capped at ``max_output``: a production trace at a small model's size."""
    if block_tokens == BLOCK_TOKENS and max_output is None:
        return records
    return [
        TraceRecord(
            timestamp_ms=r.timestamp_ms,
            input_length=max(1, -(-r.input_length * block_tokens // BLOCK_TOKENS)),
            output_length=min(r.output_length, max_output) if max_output is not None else r.output_length,
            hash_ids=r.hash_ids,
        )
        for r in records
    ]


def arrival_offsets(records: list[TraceRecord], speedup: float) -> Iterator[float]:
    """Seconds after the first record at which each record is sent, the trace's clock divided by ``speedup``."""
    if not records:
        return
    first = records[0].timestamp_ms
    for record in records:
        yield max(record.timestamp_ms - first, 0.0) / 1000.0 / speedup


class PromptBuilder:
    """Prompts for trace records: block i's text is a function of ``(salt, hash_ids[i])`` only."""

    def __init__(self, salt: str, block_tokens: int = BLOCK_TOKENS) -> None:
        self._salt = salt
        self._block_tokens = block_tokens
        self._blocks: OrderedDict[int, str] = OrderedDict()

    def block(self, hash_id: int, tokens: int | None = None) -> str:
        """The text of block ``hash_id``, or its first ``tokens`` tokens."""
        if tokens is not None and tokens < self._block_tokens:
            return "".join(text.units(text.rng_for(self._salt, "block", hash_id), self._block_tokens)[:tokens])
        cached = self._blocks.get(hash_id)
        if cached is None:
            cached = text.text(text.rng_for(self._salt, "block", hash_id), self._block_tokens)
            self._blocks[hash_id] = cached
            if len(self._blocks) > _CACHED_BLOCKS:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(hash_id)
        return cached

    def blocks(self, record: TraceRecord, index: int = 0) -> list[str]:
        """The prompt as its blocks: whole blocks, the last one cut to ``input_length``.

        A record longer than its blocks (not seen in Mooncake traces) is padded with text unique to it.
        """
        remaining = max(record.input_length, 1)
        out = []
        for hash_id in record.hash_ids:
            if remaining <= 0:
                break
            take = min(remaining, self._block_tokens)
            out.append(self.block(hash_id, take))
            remaining -= take
        if remaining > 0:
            out.append(text.text(text.rng_for(self._salt, "tail", index), remaining))
        return out

    def prompt(self, record: TraceRecord, index: int = 0) -> str:
        return "".join(self.blocks(record, index))
