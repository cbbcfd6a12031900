"""Fingerprints in blocks of tokens, from a real (small, freshly trained) Hugging Face tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from spillgate.cache.fingerprint import canonical_chat
from spillgate.cache.tokens import PromptTokenizer
from spillgate.gateway.dispatch.prefix import PrefixTracker
from tests.support.tokenizer import train_tokenizer

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 40}


def conversation(turns: int) -> list[dict[str, str]]:
    messages = [SYSTEM]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: why? " * 20})
        messages.append({"role": "assistant", "content": f"Answer {turn}: because. " * 20})
    return messages


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def token_tracker(tokenizer_file: Path) -> PrefixTracker:
    """Blocks of 16 tokens of the trained tokenizer."""
    tokenizer = PromptTokenizer(Tokenizer.from_file(str(tokenizer_file)))
    return PrefixTracker(block_chars=256, max_blocks=512, tokenizer=tokenizer, block_tokens=16)


def test_turn_n_plus_one_extends_turn_n_in_tokens_and_tenants_never_collide(tokenizer_file: Path) -> None:
    tracker = token_tracker(tokenizer_file)
    assert tracker.tokens_per_block == 16
    shorter = tracker.fingerprint({"messages": conversation(2)}, chat=True, salt="a")
    longer = tracker.fingerprint({"messages": conversation(3)}, chat=True, salt="a")
    assert len(shorter.hashes) >= 10 and longer.hashes[: len(shorter.hashes)] == shorter.hashes
    assert len(longer.hashes) == longer.length // 16, "every full block of tokens, none of the partial last one"
    other = tracker.fingerprint({"messages": conversation(3)}, chat=True, salt="b")
    assert not set(other.hashes) & set(longer.hashes)


def test_a_record_sent_again_is_not_tokenized_again(tokenizer_file: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    prompts = PromptTokenizer(tokenizer)
    ids = prompts.chat(conversation(2))
    assert prompts.cached_tokens == len(ids)
    longer = prompts.chat(conversation(3))
    new_records = conversation(3)[-2:]
    added = sum(len(tokenizer.encode(canonical_chat([m]), add_special_tokens=False).ids) for m in new_records)
    assert prompts.cached_tokens == len(ids) + added, "only the two new messages were tokenized and kept"
    assert longer[: len(ids)] == ids
    bounded = PromptTokenizer(tokenizer, cache_tokens=200)
    for turns in range(1, 6):
        bounded.chat(conversation(turns))
        assert bounded.cached_tokens <= 200


def test_feedback_is_judged_in_token_blocks(tokenizer_file: Path) -> None:
    tracker = token_tracker(tokenizer_file)
    tracker.capacity_known("r0", 100_000)
    fingerprint = tracker.fingerprint({"messages": conversation(2)}, chat=True, salt="t")
    tracker.dispatched("r0", fingerprint)
    predicted = len(fingerprint.hashes)
    nominal = tracker.index.believed_capacity("r0")
    held_all = {"prompt_tokens": fingerprint.length, "prompt_tokens_details": {"cached_tokens": fingerprint.length}}
    tracker.observed("r0", fingerprint, predicted, held_all)
    assert tracker.index.believed_capacity("r0") == nominal
    held_half = {
        "prompt_tokens": fingerprint.length,
        "prompt_tokens_details": {"cached_tokens": fingerprint.length // 2},
    }
    tracker.observed("r0", fingerprint, predicted, held_half)
    assert tracker.index.believed_capacity("r0") < nominal


def test_a_completion_given_as_token_ids_is_hashed_as_those_tokens(tokenizer_file: Path) -> None:
    tracker = token_tracker(tokenizer_file)
    ids = list(range(1000, 1040))
    fingerprint = tracker.fingerprint({"prompt": ids}, chat=False, salt="t")
    assert (fingerprint.length, len(fingerprint.hashes)) == (40, 2)
    extended = tracker.fingerprint({"prompt": [*ids, 7, 8]}, chat=False, salt="t")
    assert extended.hashes[:2] == fingerprint.hashes
    odd = tracker.fingerprint({"prompt": [-1, 2**40]}, chat=False, salt="t")  # not ids: as text
    assert odd.length > 0
