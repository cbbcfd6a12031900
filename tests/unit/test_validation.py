"""What the gateway reads from a body for routing and reservations: the worst case, never less."""

from __future__ import annotations

import orjson
import pytest

from spillgate.gateway.control.config import LimitsConfig
from spillgate.gateway.errors import ApiError
from spillgate.gateway.serving.validation import parse_chat_request

LIMITS = LimitsConfig()


def parse(**body: object) -> object:
    return parse_chat_request(
        orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}), LIMITS
    )


def test_the_larger_output_limit_counts_whichever_field_comes_last() -> None:
    assert parse(max_tokens=1, max_completion_tokens=300).max_tokens == 300
    assert parse(max_completion_tokens=300, max_tokens=1).max_tokens == 300


def test_several_choices_multiply_the_worst_case() -> None:
    assert parse(n=3).choices == 3
    assert parse(n=2, best_of=5).choices == 5
    for bad in (0, 17, "2", True):
        with pytest.raises(ApiError) as info:
            parse(n=bad)
        assert info.value.status == 422 and info.value.param == "n"


def test_images_and_any_language_are_not_counted_as_free() -> None:
    image = [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]
    with_image = parse_chat_request(
        orjson.dumps({"model": "m", "messages": [{"role": "user", "content": image}]}), LIMITS
    )
    assert with_image.prompt_tokens >= 1000
    chinese = "你好世界" * 100
    parsed = parse_chat_request(
        orjson.dumps({"model": "m", "messages": [{"role": "user", "content": chinese}]}), LIMITS
    )
    assert parsed.body_bytes >= len(chinese.encode()), "the byte bound covers a tokenizer's worst case"
