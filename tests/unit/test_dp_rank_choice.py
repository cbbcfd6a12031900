"""A data-parallel replica's ranks: which one a request goes to, how each rank's events keep its own record, and
how the engines say where the ranks publish and take a rank."""

from __future__ import annotations

import asyncio
from array import array

import httpx
import pytest

from spillgate.backends.engines import KvEventSource, engine_named
from spillgate.backends.sim.prompt_encoder import SimulatedPromptIds
from spillgate.cache.fingerprint import cache_seed, token_block_hashes
from spillgate.cache.kv_events import AllCleared, BlocksRemoved, BlocksStored, EventBatch
from spillgate.gateway.dispatch.prefix import Fingerprint, PrefixTracker, rank_record
from spillgate.policies.dp_rank import choose_rank

BLOCK = 4
REPLICA = "pool/10.0.0.1:8000"


# the choice -----------------------------------------------------------------------------------------------------


def test_the_rank_holding_the_longest_prefix_wins_whatever_its_load() -> None:
    assert choose_rank([1, 3, 2], [0, 9, 0], turn=0) == 1


def test_among_ranks_holding_as_much_the_least_loaded_then_the_next_in_turn() -> None:
    assert choose_rank([2, 2, 0], [3, 1, 0], turn=0) == 1
    assert choose_rank([0, 0, 0, 0], [1, 0, 1, 0], turn=2) == 3
    assert choose_rank([0, 0, 0, 0], [1, 0, 1, 0], turn=0) == 1


def test_equal_ranks_take_turns() -> None:
    turn, chosen = 0, []
    for _ in range(6):
        rank = choose_rank([0, 0, 0], [0, 0, 0], turn)
        chosen.append(rank)
        turn = rank + 1
    assert chosen == [0, 1, 2, 0, 1, 2]


# the records ----------------------------------------------------------------------------------------------------


def tracker(ranks: int = 2) -> PrefixTracker:
    prefix = PrefixTracker(block_chars=256, max_blocks=64, tokenizer=SimulatedPromptIds(), block_tokens=BLOCK)
    prefix.capacity_known(REPLICA, 10_000)
    prefix.follow(REPLICA, ranks)
    for rank in range(ranks):
        prefix.catching_up(rank_record(REPLICA, rank), False)
        prefix.reset(rank_record(REPLICA, rank), complete=True)  # batch 0: an empty cache, seen from the start
    return prefix


def fingerprint(tokens: list[int]) -> Fingerprint:
    hashes = token_block_hashes(array("I", tokens), cache_seed(None), block_tokens=BLOCK, max_blocks=64)
    return Fingerprint(tuple(hashes), hashes[0], len(tokens))


def store(prefix: PrefixTracker, rank: int, tokens: list[int], first_hash: int = 1) -> tuple[int, ...]:
    hashes = tuple(range(first_hash, first_hash + len(tokens) // BLOCK))
    event = BlocksStored(hashes, None, tokens, BLOCK, None)
    prefix.apply(rank_record(REPLICA, rank), EventBatch(seq=1, ts=0.0, events=(event,), rank=rank))
    return hashes


PROMPT = list(range(100, 124))  # six blocks


def test_a_request_is_matched_on_the_rank_holding_its_prefix_and_sent_there() -> None:
    prefix = tracker()
    store(prefix, 1, PROMPT[:16])
    print_ = fingerprint(PROMPT)
    assert prefix.matched_blocks(print_, [REPLICA]) == {REPLICA: 4}
    assert print_.rank_depths[REPLICA] == (0, 4)
    assert prefix.source(REPLICA) == "events"
    assert prefix.dispatched(REPLICA, print_) == 1
    assert prefix.outstanding(REPLICA) == [0, 1]
    prefix.settled(REPLICA, 1)
    assert prefix.outstanding(REPLICA) == [0, 0]


def test_what_was_just_sent_to_a_rank_counts_there_until_its_events_tell() -> None:
    prefix = tracker()
    first = fingerprint(PROMPT)
    prefix.matched_blocks(first, [REPLICA])
    rank = prefix.dispatched(REPLICA, first)
    assert rank is not None
    again = fingerprint(PROMPT)
    assert prefix.matched_blocks(again, [REPLICA]) == {REPLICA: 6}
    assert again.rank_depths[REPLICA][rank] == 6 and again.rank_depths[REPLICA][1 - rank] == 0
    assert prefix.dispatched(REPLICA, again) == rank, "it follows the first, though that rank is busier"


def test_new_prompts_go_to_the_least_loaded_rank_then_in_turn() -> None:
    prefix = tracker(3)
    chosen = []
    for index in range(3):
        print_ = fingerprint([index * 1000 + i for i in range(24)])
        prefix.matched_blocks(print_, [REPLICA])
        chosen.append(prefix.dispatched(REPLICA, print_))
    assert chosen == [0, 1, 2]
    prefix.settled(REPLICA, 1)
    print_ = fingerprint([9000 + i for i in range(24)])
    prefix.matched_blocks(print_, [REPLICA])
    assert prefix.dispatched(REPLICA, print_) == 1, "the only rank with nothing in flight"


def test_each_rank_is_its_own_record_through_removals_clears_and_restarts() -> None:
    prefix = tracker()
    hashes = store(prefix, 0, PROMPT)
    store(prefix, 1, PROMPT[:8], first_hash=50)
    assert fingerprint(PROMPT).rank_depths == {}
    print_ = fingerprint(PROMPT)
    prefix.matched_blocks(print_, [REPLICA])
    assert print_.rank_depths[REPLICA] == (6, 2)
    removed = BlocksRemoved(hashes[3:])
    prefix.apply(REPLICA, EventBatch(seq=2, ts=0.0, events=(removed,), rank=0))
    print_ = fingerprint(PROMPT)
    prefix.matched_blocks(print_, [REPLICA])
    assert print_.rank_depths[REPLICA] == (3, 2)
    prefix.apply(rank_record(REPLICA, 1), EventBatch(seq=2, ts=0.0, events=(AllCleared(),), rank=1))
    print_ = fingerprint(PROMPT)
    prefix.matched_blocks(print_, [REPLICA])
    assert print_.rank_depths[REPLICA] == (3, 0)
    prefix.restarted(REPLICA)
    print_ = fingerprint(PROMPT)
    assert prefix.matched_blocks(print_, [REPLICA]) == {REPLICA: 0}
    assert print_.rank_depths[REPLICA] == (0, 0)


def test_a_rank_catching_up_holds_nothing_and_all_catching_up_leaves_the_belief() -> None:
    prefix = tracker()
    store(prefix, 1, PROMPT)
    prefix.catching_up(rank_record(REPLICA, 1), True)
    print_ = fingerprint(PROMPT)
    assert prefix.matched_blocks(print_, [REPLICA]) == {REPLICA: 0}
    assert prefix.source(REPLICA) == "events+belief"
    prefix.index.insert(REPLICA, print_.hashes)  # what the belief holds: every rank's, told apart by none
    prefix.catching_up(REPLICA, True)
    assert prefix.matched_blocks(fingerprint(PROMPT), [REPLICA]) == {REPLICA: 6}
    assert prefix.source(REPLICA) == "belief"


def test_another_process_sends_name_their_rank() -> None:
    prefix = tracker()
    prefix.sent_elsewhere(REPLICA, fingerprint(PROMPT).hashes, 1)
    print_ = fingerprint(PROMPT)
    prefix.matched_blocks(print_, [REPLICA])
    assert print_.rank_depths[REPLICA] == (0, 6)


def test_following_again_with_another_rank_count_starts_every_record_afresh() -> None:
    prefix = tracker()
    store(prefix, 1, PROMPT)
    prefix.follow(REPLICA, 3)
    assert prefix.ranks(REPLICA) == 3 and prefix.outstanding(REPLICA) == [0, 0, 0]
    assert prefix.source(REPLICA) == "belief"
    assert prefix.exact is not None and prefix.exact.blocks_held(rank_record(REPLICA, 1)) == 0
    prefix.unfollow(REPLICA)
    assert prefix.ranks(REPLICA) == 0 and not prefix.exact.knows(rank_record(REPLICA, 2))


def test_a_replica_without_data_parallelism_gets_no_rank() -> None:
    prefix = tracker(1)
    print_ = fingerprint(PROMPT)
    prefix.matched_blocks(print_, [REPLICA])
    assert prefix.dispatched(REPLICA, print_) is None and print_.rank_depths == {}


# the engines ----------------------------------------------------------------------------------------------------


def test_a_ranks_sockets_are_the_ports_after_rank_0s() -> None:
    source = KvEventSource("tcp://10.0.0.1:5557", "tcp://10.0.0.1:6000", "kv", ranks=4)
    assert source.rank(0) is source
    assert source.rank(3) == KvEventSource("tcp://10.0.0.1:5560", "tcp://10.0.0.1:6003", "kv", ranks=4)
    assert KvEventSource("tcp://*:5557").at_host("[::1]").rank(1).endpoint == "tcp://[::1]:5558"


def describe(engine: str, pages: dict[str, object]) -> KvEventSource | None:
    async def get(path: str) -> httpx.Response:
        body = pages.get(path)
        request = httpx.Request("GET", "http://replica" + path)
        return httpx.Response(404, request=request) if body is None else httpx.Response(200, json=body, request=request)

    return asyncio.run(engine_named(engine).describe(get, "m")).kv_events


def test_sglang_says_how_many_ranks_publish() -> None:
    events = {"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 5557, "topic": "", "dp_size": 4}
    source = describe(
        "sglang", {"/server_info": {"dp_size": 4, "kv_events": {**events, "replay_endpoint_port_base": 7000}}}
    )
    assert source == KvEventSource("tcp://*:5557", "tcp://*:7000", "", ranks=4)
    del events["dp_size"]  # an older server: the server's own dp_size
    assert describe("sglang", {"/server_info": {"dp_size": 2, "kv_events": events}}).ranks == 2  # type: ignore[union-attr]


def test_vllm_lists_each_rank_and_only_those_on_the_ports_after_are_followed() -> None:
    def rank(port: int) -> dict[str, object]:
        return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": ""}

    assert describe("vllm", {"/kv_event_sources": {"0": rank(5557), "1": rank(5558), "2": rank(5559)}}).ranks == 3  # type: ignore[union-attr]
    assert describe("vllm", {"/kv_event_sources": {"0": rank(5557), "1": rank(6000)}}).ranks == 1  # type: ignore[union-attr]
    alone = describe("vllm", {"/kv_event_sources": {"3": rank(5560)}})
    assert alone == KvEventSource("tcp://*:5560", None, "", ranks=1), "a server fronting one rank of many"


@pytest.mark.parametrize(
    ("engine", "body", "headers"),
    [("sglang", {"data_parallel_rank": 2}, ()), ("vllm", {}, ((b"x-data-parallel-rank", b"2"),))],
)
def test_each_engine_is_told_the_rank_its_own_way(engine: str, body: dict[str, int], headers: tuple) -> None:
    payload: dict[str, object] = {}
    assert engine_named(engine).to_rank(payload, 2) == headers
    assert payload == body
    assert "data_parallel_rank" in engine_named(engine).owned_fields, "a client cannot pick the rank"
