"""Prompt builders: trace prompts share exactly the blocks their hash_ids share; workloads are reproducible."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from spillgate.backends.sim.tokenizer import Tokenizer
from spillgate.gateway.bench import text
from spillgate.gateway.bench.config import AgentKnobs, BenchConfig, ChatKnobs, GspKnobs
from spillgate.gateway.bench.trace import (
    BLOCK_TOKENS,
    PromptBuilder,
    TraceError,
    TraceRecord,
    arrival_offsets,
    load_trace,
)
from spillgate.gateway.bench.workloads import (
    RequestSpec,
    Workload,
    agent_workload,
    build_workload,
    chat_workload,
    gsp_workload,
    tool_definitions,
    trace_workload,
)

SAMPLE_TRACE = Path("/work/shared/traces/mooncake/synthetic_trace.jsonl")


def record(ids: list[int], input_length: int | None = None, timestamp: float = 0.0) -> TraceRecord:
    length = len(ids) * BLOCK_TOKENS if input_length is None else input_length
    return TraceRecord(timestamp_ms=timestamp, input_length=length, output_length=8, hash_ids=tuple(ids))


@pytest.mark.parametrize("k", [0, 1, 3])
def test_records_sharing_k_leading_ids_share_exactly_k_blocks(k: int) -> None:
    builder = PromptBuilder("7:0")
    shared = [10, 11, 12][:k]
    a = record([*shared, 100, 101])
    b = record([*shared, 200, 201])
    blocks_a, blocks_b = builder.blocks(a), builder.blocks(b)
    assert blocks_a[:k] == blocks_b[:k]
    assert blocks_a[k] != blocks_b[k]
    prompt_a, prompt_b = builder.prompt(a), builder.prompt(b)
    shared_chars = sum(len(block) for block in blocks_a[:k])
    common = next((i for i, (x, y) in enumerate(zip(prompt_a, prompt_b, strict=False)) if x != y), len(prompt_a))
    assert shared_chars <= common < shared_chars + len(blocks_a[k])
    assert PromptBuilder("7:0").prompt(a) == prompt_a, "block text depends on the id and salt only"
    assert PromptBuilder("8:0").blocks(a)[0] != blocks_a[0], "another seed gives other text"


def test_prompt_length_follows_input_length() -> None:
    tokenizer = Tokenizer()
    builder = PromptBuilder("0:0")
    full = record([1, 2, 3])
    cut = record([1, 2, 3], input_length=2 * BLOCK_TOKENS + 100)
    assert len(tokenizer.encode(builder.prompt(full))) == 3 * BLOCK_TOKENS
    assert len(tokenizer.encode(builder.prompt(cut))) == 2 * BLOCK_TOKENS + 100
    assert builder.prompt(full).startswith(builder.prompt(cut)), "a cut last block is a prefix of the whole block"
    padded = record([1], input_length=BLOCK_TOKENS + 40)
    assert len(tokenizer.encode(builder.prompt(padded, index=5))) == BLOCK_TOKENS + 40


def test_text_is_about_four_characters_per_token() -> None:
    sample = text.text(text.rng_for("x"), 2000)
    assert len(Tokenizer().encode(sample)) == 2000
    assert 3.5 <= len(sample) / 2000 <= 5.0


def test_load_trace_and_arrivals(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(
        '{"timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
        "\n"
        '{"timestamp": 3000, "input_length": 100, "output_length": 2, "hash_ids": [0]}\n'
    )
    records = load_trace(path)
    assert [r.hash_ids for r in records] == [(0, 1), (0,)]
    assert list(arrival_offsets(records, speedup=2.0)) == [0.0, 1.0]
    path.write_text('{"timestamp": 0, "output_length": 5}\n')
    with pytest.raises(TraceError, match=":1:"):
        load_trace(path)


@pytest.mark.skipif(not SAMPLE_TRACE.exists(), reason="the shared Mooncake sample is not on this machine")
def test_the_shared_mooncake_sample_parses() -> None:
    records = load_trace(SAMPLE_TRACE)
    assert len(records) > 1000
    assert all(r.input_length <= len(r.hash_ids) * BLOCK_TOKENS for r in records)


async def test_trace_workload_sends_records_in_order() -> None:
    records = [record([1, 2], timestamp=0), record([1, 3], timestamp=5)]
    workload = trace_workload(records, "0:0")
    first, second, end = await workload.next(), await workload.next(), await workload.next()
    assert first is not None and second is not None and end is None
    assert first.max_tokens == 8
    assert first.messages[0]["content"][:2000] == second.messages[0]["content"][:2000]


async def test_gsp_groups_share_their_system_prompt() -> None:
    knobs = GspKnobs(groups=3, prompts_per_group=4, system_tokens=64, question_tokens=16, output_tokens=8)
    specs = [spec async for spec in _drain(gsp_workload(knobs, "1:0", cycle=False))]
    assert len(specs) == 12
    systems = [spec.messages[0]["content"] for spec in specs]
    assert len(set(systems)) == 3 and all(systems.count(s) == 4 for s in set(systems))
    assert len({spec.messages[1]["content"] for spec in specs}) == 12, "every question differs"
    again = [spec async for spec in _drain(gsp_workload(knobs, "1:0", cycle=False))]
    assert [s.messages for s in again] == [s.messages for s in specs], "seeded: the same run twice"
    assert systems != sorted(systems, key=systems.index), "groups are interleaved, not sent one after another"


async def test_gsp_zipf_makes_a_few_groups_hot() -> None:
    knobs = GspKnobs(
        groups=8, prompts_per_group=50, system_tokens=16, question_tokens=4, output_tokens=4,
        group_distribution="zipf", zipf_alpha=1.1,
    )  # fmt: skip
    specs = [spec async for spec in _drain(gsp_workload(knobs, "2:0", cycle=False))]
    assert len(specs) == 400, "the same number of requests as uniform"
    systems = [spec.messages[0]["content"] for spec in specs]
    by_popularity = sorted((systems.count(system) for system in set(systems)), reverse=True)
    # 1/rank**1.1 over 8 ranks: the hottest group expects ~40% of the requests (159), the coldest ~4% (16).
    assert 110 <= by_popularity[0] <= 190 and by_popularity[-1] <= 30
    again = [spec.messages async for spec in _drain(gsp_workload(knobs, "2:0", cycle=False))]
    assert again == [spec.messages for spec in specs], "seeded: the same run twice"
    with pytest.raises(ValueError, match="--gsp-zipf-alpha must be a finite number above 0"):
        BenchConfig(
            url="http://127.0.0.1:1", rate=1.0, gsp=GspKnobs(group_distribution="zipf", zipf_alpha=0.0)
        ).validate()
    with pytest.raises(ValueError, match="--gsp-group-distribution must be one of uniform, zipf"):
        BenchConfig(url="http://127.0.0.1:1", rate=1.0, gsp=GspKnobs(group_distribution="pareto")).validate()


async def test_chat_turns_carry_the_history_and_the_reply() -> None:
    workload = chat_workload(ChatKnobs(sessions=2, turns=2, user_tokens=8, output_tokens=4), "0:0", cycle=False)
    first = await workload.next()
    other = await workload.next()
    assert first is not None and other is not None and first.session is not other.session
    workload.finished(first, "the reply text")
    follow = await workload.next()
    assert follow is not None and follow.session is first.session
    assert follow.messages[:2] == [first.messages[0], {"role": "assistant", "content": "the reply text"}]
    assert follow.messages[2]["role"] == "user" and len(follow.messages) == 3
    workload.finished(follow, "done")  # last turn of conversation 0
    workload.finished(other, None)  # a failed turn ends its session
    assert await workload.next() is None


async def test_ready_sessions_send_in_random_order_unless_fifo() -> None:
    knobs = ChatKnobs(sessions=8, turns=2, user_tokens=8, output_tokens=4)

    async def second_turns(order: str, salt: str) -> list[int]:
        """Answer every first turn in the order sent, then see which session sends its second turn first."""
        workload = chat_workload(knobs, salt, cycle=False, order=order)
        first = [await workload.next() for _ in range(8)]
        for spec in first:
            assert spec is not None
            workload.finished(spec, "reply")
        return [spec.session.id for spec in [await workload.next() for _ in range(8)] if spec and spec.session]

    assert await second_turns("fifo", "0:0") == list(range(8)), "fifo: answered first, sent first"
    shuffled = await second_turns("random", "0:0")
    assert sorted(shuffled) == list(range(8)) and shuffled != list(range(8))
    assert await second_turns("random", "0:0") == shuffled, "seeded by the salt"
    with pytest.raises(ValueError, match="session order must be one of random, fifo"):
        chat_workload(knobs, "0:0", cycle=False, order="lifo")


async def test_agent_sessions_share_the_tool_prefix() -> None:
    knobs = AgentKnobs(sessions=2, steps=2, tool_tokens=500, step_tokens=8, output_tokens=4)
    workload = agent_workload(knobs, "0:0", cycle=False)
    a, b = await workload.next(), await workload.next()
    assert a is not None and b is not None
    assert a.messages[0] == b.messages[0] and a.messages[1] != b.messages[1]
    assert 400 <= len(Tokenizer().encode(tool_definitions("0:0", 500))) <= 700


async def _drain(workload: Workload) -> AsyncIterator[RequestSpec]:
    while (spec := await workload.next()) is not None:
        yield spec


def test_closed_loop_gets_at_least_one_session_per_worker() -> None:
    config = BenchConfig(
        url="http://127.0.0.1:1", workload="chat", concurrency=(8,), chat=ChatKnobs(sessions=2, turns=3)
    )
    assert build_workload(config, "0:0", cycle=False, min_sessions=8).natural_size == 8 * 3
    assert build_workload(config, "0:0", cycle=False, min_sessions=1).natural_size == 2 * 3
