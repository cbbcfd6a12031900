"""A prompt's token ids exactly as the engine computes them: the served model's chat template, then its tokenizer.

Matching a prompt against a replica's KV-cache events needs the very ids the engine cached, so the chat is
rendered with the model's own Jinja template (as ``transformers``' ``apply_chat_template`` renders it, which is
what SGLang and vLLM call) and encoded without adding special tokens; a completions prompt is encoded with them.

Tokenizing an 8k-token prompt takes milliseconds, so the rendered text is cut at the tokenizer's special tokens
(``<|start_header_id|>``, ``<|eot_id|>``...), which a Hugging Face tokenizer never merges across, and each
piece's ids are cached: the system prompt and earlier turns, sent again with every request, are encoded once.
At load the cut is checked against encoding whole texts; a tokenizer for which they differ encodes whole texts.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from spillgate.cache.tokens import DEFAULT_CACHE_TOKENS, IdsCache

_SELF_CHECK = (
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there, 12 + 30 = ?"}],
    [
        {"role": "user", "content": "  leading spaces and\nnew lines\n\n"},
        {"role": "assistant", "content": "ok."},
        {"role": "user", "content": [{"type": "text", "text": "parts"}]},
    ],
)


class NoChatTemplate(ValueError):
    """The model directory has no usable tokenizer or chat template."""


class TemplateTokenizer:
    """The engine's prompt token ids for chats and completions, with the ids of repeated pieces cached."""

    exact = True
    """These are the ids the engine caches: they can be matched against its KV-cache events."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        template: str,
        specials: Mapping[str, str],
        *,
        cache_tokens: int = DEFAULT_CACHE_TOKENS,
    ) -> None:
        self._tokenizer = tokenizer
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise
        environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = environment.from_string(template)
        self._specials = dict(specials)
        added = {token.content: token_id for token_id, token in tokenizer.get_added_tokens_decoder().items()}
        self._added = added
        self._split = (
            re.compile("(" + "|".join(re.escape(text) for text in sorted(added, key=len, reverse=True)) + ")")
            if added
            else None
        )
        self._cache = IdsCache(cache_tokens)
        checked = [self._agrees(sample) for sample in _SELF_CHECK] if self._split is not None else []
        # Cut only where it is shown to change nothing; a template refusing both samples is encoded whole.
        self._segmented = any(result is not None for result in checked) and all(r is not False for r in checked)

    @classmethod
    def from_directory(cls, path: str | Path) -> TemplateTokenizer:
        """A model directory as Hugging Face lays it out: ``tokenizer.json`` plus ``tokenizer_config.json`` and its
        ``chat_template`` (or a ``chat_template.jinja`` beside it)."""
        directory = Path(path)
        try:
            tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises plain Exceptions for missing or malformed files
            raise NoChatTemplate(f"cannot load {directory / 'tokenizer.json'} ({exc})") from None
        config_path = directory / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.exists() else {}
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((item.get("template") for item in template if item.get("name") == "default"), None)
        jinja_file = directory / "chat_template.jinja"
        if not isinstance(template, str) and jinja_file.exists():
            template = jinja_file.read_text()
        if not isinstance(template, str):
            raise NoChatTemplate(f"{directory} has no chat template (tokenizer_config.json or chat_template.jinja)")
        specials = {
            name: _token_text(config.get(name)) for name in ("bos_token", "eos_token", "unk_token", "pad_token")
        }
        return cls(tokenizer, template, specials)

    def chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> array[int]:
        try:
            text = self._template.render(
                messages=messages, tools=tools or None, add_generation_prompt=True, **self._specials
            )
        except (TemplateError, TypeError, AttributeError, KeyError, IndexError) as exc:  # a client's odd message
            raise ValueError(f"the chat template cannot render this conversation: {exc}") from None
        return self._encode(text, special=False)

    def completion(self, prompt: object) -> array[int]:
        if isinstance(prompt, list) and prompt and all(isinstance(item, int) for item in prompt):
            return array("I", prompt)
        if isinstance(prompt, list):
            prompt = "".join(str(item) for item in prompt)
        return self._encode(str(prompt), special=True)

    @property
    def cached_tokens(self) -> int:
        return self._cache.tokens

    def _encode(self, text: str, *, special: bool) -> array[int]:
        if special or not self._segmented:
            return self._piece(text, special=special)
        return self._segments(text)

    def _segments(self, text: str) -> array[int]:
        assert self._split is not None
        ids = array("I")
        added = self._added
        for piece in self._split.split(text):
            if not piece:
                continue
            token = added.get(piece)
            if token is not None:
                ids.append(token)
            else:
                ids.extend(self._piece(piece, special=False))
        return ids

    def _piece(self, text: str, *, special: bool) -> array[int]:
        encode = self._encode_special if special else self._encode_plain
        return self._cache.ids(text, encode, variant=int(special))

    def _encode_plain(self, text: str) -> Sequence[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def _encode_special(self, text: str) -> Sequence[int]:
        return self._tokenizer.encode(text, add_special_tokens=True).ids

    def _agrees(self, messages: list[dict[str, Any]]) -> bool | None:
        """Whether cutting this conversation at special tokens encodes it as a whole; None if the template
        refuses it."""
        try:
            text = self._template.render(messages=messages, add_generation_prompt=True, **self._specials)
        except TemplateError:
            return None
        whole = array("I", self._tokenizer.encode(text, add_special_tokens=False).ids)
        return self._segments(text) == whole


def _token_text(value: object) -> str:
    if isinstance(value, Mapping):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


def _tojson(value: object, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise(message: str) -> None:
    raise TemplateError(message)
