"""A small real Hugging Face tokenizer, trained on the spot: tests need a tokenizer.json and have no network."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

CORPUS = [
    "You are a careful assistant. Answer briefly and cite the policy section.",
    "Group policy manual: every rule applies to every request, in order.",
    "Why? Because the cache keeps the prefix, and the next turn extends it.",
]


def train_tokenizer(path: Path, vocab_size: int = 400) -> Path:
    """Byte-level BPE (any text encodes, control characters included), written to ``path``."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    tokenizer.save(str(path))
    return path
