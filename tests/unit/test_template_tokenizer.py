"""The engine's own prompt ids: a model directory's chat template rendered as apply_chat_template renders it,
encoded piece by piece between special tokens exactly as the whole text encodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer

from spillgate.cache.template import NoChatTemplate, TemplateTokenizer
from spillgate.cache.tokens import PromptTokenizer
from spillgate.gateway.control.config import ConfigError
from spillgate.gateway.state import load_tokenizer
from tests.support.tokenizer import train_tokenizer

SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}{% else %}"
    "{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}{{ '<|eot_id|>' }}{% endfor %}"
    "{% if tools %}{{ tools | tojson }}{% endif %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("model")
    tokenizer = Tokenizer.from_file(str(train_tokenizer(directory / "plain.json")))
    tokenizer.add_special_tokens([AddedToken(text, special=True) for text in SPECIALS])
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}, "chat_template": TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def whole_text_ids(directory: Path, text: str) -> list[int]:
    return Tokenizer.from_file(str(directory / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def test_a_chat_is_the_rendered_template_encoded_whole(model_dir: Path) -> None:
    tokenizer = TemplateTokenizer.from_directory(model_dir)
    messages = [
        {"role": "system", "content": "You are a careful assistant.  "},
        {"role": "user", "content": [{"type": "text", "text": "Why? Because the cache keeps the prefix."}]},
    ]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    rendered = (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a careful assistant.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhy? Because the cache keeps the prefix.<|eot_id|>"
        + json.dumps(tools)
        + "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    for _ in range(2):  # the second time from the cache of pieces
        assert tokenizer.chat(messages, tools).tolist() == whole_text_ids(model_dir, rendered)
    assert tokenizer.chat(messages).tolist()[0] == Tokenizer.from_file(str(model_dir / "tokenizer.json")).token_to_id(
        "<|begin_of_text|>"
    )
    assert tokenizer.cached_tokens > 0


def test_a_longer_conversation_extends_a_shorter_ones_ids(model_dir: Path) -> None:
    tokenizer = TemplateTokenizer.from_directory(model_dir)
    turn = [{"role": "user", "content": "Group policy manual: every rule applies."}]
    longer = [*turn, {"role": "assistant", "content": "In order."}, {"role": "user", "content": "Why?"}]
    short = tokenizer.chat(turn).tolist()
    header = len(whole_text_ids(model_dir, "<|start_header_id|>assistant<|end_header_id|>\n\n"))
    assert tokenizer.chat(longer).tolist()[: len(short) - header] == short[:-header]


def test_completions_are_encoded_with_the_tokenizers_own_special_tokens_and_ids_pass_through(model_dir: Path) -> None:
    tokenizer = TemplateTokenizer.from_directory(model_dir)
    text = "Answer briefly and cite the policy section."
    expected = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(text).ids
    assert tokenizer.completion(text).tolist() == expected
    assert tokenizer.completion([5, 6, 7]).tolist() == [5, 6, 7]


def test_a_template_that_raises_is_a_value_error(model_dir: Path, tmp_path: Path) -> None:
    for name in ("tokenizer.json",):
        (tmp_path / name).write_bytes((model_dir / name).read_bytes())
    config = {"chat_template": "{{ raise_exception('only user turns') }}"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = TemplateTokenizer.from_directory(tmp_path)
    with pytest.raises(ValueError, match="only user turns"):
        tokenizer.chat([{"role": "system", "content": "x"}])


def test_prefix_tokenizer_names_a_directory_a_file_or_a_registered_name(model_dir: Path, tmp_path: Path) -> None:
    assert load_tokenizer(str(model_dir)).exact
    assert isinstance(load_tokenizer(str(model_dir / "tokenizer.json")), PromptTokenizer)
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    with pytest.raises(ConfigError, match="no chat template"):
        load_tokenizer(str(tmp_path))
    with pytest.raises(ConfigError, match="cannot load"):
        load_tokenizer(str(tmp_path / "missing.json"))
    with pytest.raises(NoChatTemplate):
        TemplateTokenizer.from_directory(tmp_path)
