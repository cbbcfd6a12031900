"""A Mooncake trace shrunk to a small model's size keeps which prompts share which blocks."""

from __future__ import annotations

from spillgate.gateway.bench.trace import PromptBuilder, TraceRecord, scaled


def test_smaller_blocks_shrink_prompts_alike_and_keep_their_sharing() -> None:
    records = [TraceRecord(0, 1500, 300, (1, 2, 3)), TraceRecord(10, 1024, 40, (1, 2)), TraceRecord(20, 100, 5, (9,))]
    small = scaled(records, 64, max_output=32)
    assert [r.input_length for r in small] == [188, 128, 13]
    assert [r.output_length for r in small] == [32, 32, 5]
    assert [r.hash_ids for r in small] == [r.hash_ids for r in records]
    builder = PromptBuilder("salt", 64)
    first, second = builder.blocks(small[0]), builder.blocks(small[1])
    assert first[:2] == second[:2] and len(first) == 3
    assert scaled(records, 512) is records
