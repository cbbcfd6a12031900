"""Make the tiny random Llama the real engines serve on a CPU: weights, a byte-level BPE tokenizer, a chat template.

The weights are random, so the text it writes is noise; what matters is that SGLang and vLLM load it as they
would a real Llama and run every code path (tokenizer, chat template, prefix cache, scheduler, metrics) on it.
Deterministic: the same seed and corpus give the same files, so fixtures captured from it are reproducible.

Run with an engine's Python (it needs ``torch``, ``transformers`` and ``tokenizers``)::

    python tests/engines/tiny_model.py OUT_DIR
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

MODEL_NAME = "spillgate-tiny-llama"
VOCAB_SIZE = 2048
CONTEXT_LENGTH = 16384
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# Llama 3's template, reduced to what the gateway and the engines exercise: roles and content, generation prompt.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
_SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "nu",
    "pe",
    "ra",
    "si",
    "to",
    "vu",
    "we",
    "xa",
    "yo",
    "ze",
    "ba",
    "co",
    "da",
    "fe",
    "gi",
    "hu",
    "ji",
]


def corpus(seed: int = 0, lines: int = 4000) -> list[str]:
    """Made-up sentences of made-up words plus digits and punctuation: the tokenizer learns merges from them."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(600)]
    words += [
        "the",
        "a",
        "of",
        "to",
        "and",
        "in",
        "is",
        "it",
        "you",
        "that",
        "was",
        "for",
        "on",
        "are",
        "with",
        "as",
        "be",
        "at",
        "this",
        "have",
        "from",
        "or",
    ]
    text = []
    for _ in range(lines):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 16)))
        text.append(f"{sentence.capitalize()}{rng.choice('.!?,;:')} {rng.randint(0, 9999)}")
    return text


def make_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|end_of_text|>",
        model_max_length=CONTEXT_LENGTH,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def make_weights(out: Path, vocab_size: int) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=CONTEXT_LENGTH,
        bos_token_id=0,
        eos_token_id=4,
        pad_token_id=1,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=0, eos_token_id=4, pad_token_id=1).save_pretrained(out)


def make(out: Path) -> Path:
    """Write the model into ``out`` (created) unless a finished one is already there; return ``out``."""
    done = out / "spillgate-model.json"
    if done.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    make_tokenizer(out)
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    make_weights(out, vocab_size=max(len(vocab), VOCAB_SIZE))
    done.write_text(json.dumps({"name": MODEL_NAME, "vocab_size": VOCAB_SIZE, "context_length": CONTEXT_LENGTH}))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_model.py OUT_DIR")
    print(make(Path(sys.argv[1])))
