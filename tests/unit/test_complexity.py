"""The complexity classifier: what it reads from a request, how its score moves, and how well it separates."""

from __future__ import annotations

import math
from typing import Any

import pytest

from policies.complexity import (
    DEFAULT_THRESHOLD,
    FEATURE_NAMES,
    HAND_WEIGHTS,
    MONOTONE_FEATURES,
    ComplexityClassifier,
    ComplexityFeatures,
    LogisticModel,
    extract_features,
    fit_logistic,
    is_complex,
)
from tests.bench.complexity_eval import labels_of, load_split, metrics, request_of, score_items, split_of

# Floors for the test split at DEFAULT_THRESHOLD. Measured when the set and weights were made: precision 0.821,
# recall 0.853 (F1 0.837). The floors sit ~0.07 below, so a tweak that costs a few items is allowed, a regression
# that costs a category is not.
PRECISION_FLOOR = 0.75
RECALL_FLOOR = 0.78

CODE_BLOCK = "\n```python\n# sort and convert the rows, then say hi\ndef f(rows):\n    return sorted(rows)\n```\n"
TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
    for n in ("search", "read_file", "run_shell")
]


def chat(*texts: str, **extra: Any) -> dict[str, Any]:
    """User and assistant turns alternating, starting with the user."""
    roles = ("user", "assistant")
    return {"messages": [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)], **extra}


def test_a_greeting_is_short_simple_and_has_no_cues() -> None:
    features = extract_features(chat("hello! how are you?"))
    assert features.chars == len("hello! how are you?") and features.turns == 1
    assert features.simple_ask >= 1
    cues = features._replace(chars=0, turns=0, simple_ask=0)
    assert cues == ComplexityFeatures()


def test_code_and_stack_traces_are_counted() -> None:
    text = (
        "Why does this fail?\n```python\ndef load(path):\n    with open(path) as f:\n        return json.load(f)\n```\n"
        'Traceback (most recent call last):\n  File "app.py", line 3, in load\nJSONDecodeError: Expecting value'
    )
    features = extract_features(chat(text))
    assert features.code_blocks == 1
    assert features.code_syntax >= 2
    assert features.stack_trace >= 2
    assert "stack_trace" in ComplexityClassifier().score(chat(text)).top_reasons


def test_math_markup_equations_and_proof_words_are_counted() -> None:
    latex = extract_features(chat(r"Find all $x$ with $\frac{1}{x} + \sqrt{x} \le 3$."))
    assert latex.math_markup >= 3
    arithmetic = extract_features(chat("If 3x + 4 = 19 and y^2 = 2 * 8, what is x + y?"))
    assert arithmetic.arithmetic >= 3
    proof = extract_features(chat("Prove by induction that the sum is n^2, then show that the bound is tight."))
    assert proof.proof >= 3
    assert extract_features(chat("Derive it step by step.")).reasoning >= 2


def test_money_and_dates_do_not_look_like_math() -> None:
    features = extract_features(chat("I paid $4 for tea and $1.50 for a bun on 2024-05-14, then $20 for lunch."))
    assert features.math_markup == 0
    assert features.arithmetic == 0


def test_tools_tool_calls_and_tool_results_are_counted() -> None:
    payload = {
        "messages": [
            {"role": "user", "content": "Find the failing test and fix it."},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "a"}, {"id": "b"}]},
            {"role": "tool", "tool_call_id": "a", "content": "tests/test_x.py"},
            {"role": "tool", "tool_call_id": "b", "content": "FAILED"},
        ],
        "tools": TOOLS,
    }
    features = extract_features(payload)
    assert features.tools == 3
    assert features.tool_turns == 4  # two calls and two results
    assert features.turns == 2
    assert extract_features({"messages": [], "functions": TOOLS[:1]}).tools == 1


def test_depth_counts_user_and_assistant_turns_and_measures_the_system_prompt() -> None:
    system = "You must always answer in JSON. Compare nothing. Prove nothing."
    payload = chat("a", "b", "c", "d", "e")
    payload["messages"].insert(0, {"role": "system", "content": system})
    features = extract_features(payload)
    assert features.turns == 5
    assert features.chars == len("a\nb\nc\nd\ne")
    assert features.system_chars == len(system)
    assert features.proof == features.constraints == 0  # the system prompt is measured, not scanned


def test_content_part_lists_and_none_content_are_read() -> None:
    payload = {
        "messages": [
            {"role": "system", "content": None},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Prove that"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "text", "text": r"$\sqrt{2}$ is irrational."},
                ],
            },
        ]
    }
    features = extract_features(payload)
    assert features.chars == len("Prove that\n$\\sqrt{2}$ is irrational.")
    assert features.proof >= 1 and features.math_markup >= 1
    assert features.system_chars == 0


def test_a_completion_prompt_is_read_like_a_user_message() -> None:
    features = extract_features({"prompt": "Translate 'good night' into French."})
    assert features.turns == 1 and features.simple_ask >= 1


@pytest.mark.parametrize(
    "payload",
    [
        None,
        "hello",
        42,
        [],
        {},
        {"messages": "hello"},
        {"messages": [None, 3, "x", {"role": ["user"]}, {"content": {"text": 1}}, {"role": "user", "content": 7}]},
        {"messages": [{"role": "user", "content": [None, 5, {"text": None}, {"type": "text"}, "raw part"]}]},
        {"messages": [{"role": "assistant", "tool_calls": "nope"}], "tools": "all of them", "prompt": [1, 2, 3]},
        {"messages": [{"role": "user", "content": "\ud800 lone surrogate and \x00 nul " * 500}]},
    ],
)
def test_junk_is_tolerated(payload: Any) -> None:
    verdict = ComplexityClassifier().score(payload)
    assert isinstance(verdict.features, ComplexityFeatures)
    assert 0.0 <= verdict.score <= 1.0


def test_a_long_prompt_counts_in_full_but_is_scanned_at_its_ends() -> None:
    filler = "The quick brown fox jumps over the lazy dog. " * 2000
    features = extract_features(chat(filler + "Prove that the lemma holds."))
    assert features.chars == len(filler) + len("Prove that the lemma holds.")
    assert features.proof >= 2
    buried = extract_features(chat(filler[:40_000] + "Prove the lemma. " + filler[:40_000]))
    assert buried.proof == 0


def eval_payloads() -> list[dict[str, Any]]:
    return [request_of(item) for item in load_split("train")[:60]]


def with_code_block(payload: dict[str, Any]) -> dict[str, Any]:
    messages = [dict(m) for m in payload["messages"]]
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    messages[last]["content"] = (messages[last]["content"] or "") + CODE_BLOCK
    return {**payload, "messages": messages}


def test_adding_a_code_block_never_lowers_the_score() -> None:
    classifier = ComplexityClassifier()
    for payload in [chat("hi"), chat("Translate 'cat' into German."), *eval_payloads()]:
        before = classifier.score(payload).score
        assert classifier.score(with_code_block(payload)).score >= before, payload


def test_adding_tools_never_lowers_the_score() -> None:
    classifier = ComplexityClassifier()
    for payload in [chat("hi"), *eval_payloads()]:
        before = classifier.score(payload).score
        assert classifier.score({**payload, "tools": TOOLS}).score >= before, payload


def test_cues_of_complexity_have_non_negative_weights() -> None:
    weights = dict(zip(FEATURE_NAMES, HAND_WEIGHTS.weights, strict=True))
    assert all(weights[name] >= 0 for name in MONOTONE_FEATURES)
    assert weights["simple_ask"] < 0


def test_the_threshold_decides() -> None:
    hard = chat(r"Prove that $\sum_{k=1}^{n} k^3 = \left(\frac{n(n+1)}{2}\right)^2$ and derive a bound step by step.")
    easy = chat("hi there!")
    assert is_complex(hard) and not is_complex(easy)
    score = ComplexityClassifier().score(hard).score
    assert is_complex(hard, threshold=score) and not is_complex(hard, threshold=score + 1e-9)
    assert is_complex(easy, threshold=0.0) and not is_complex(hard, threshold=1.01)
    assert DEFAULT_THRESHOLD == 0.5


class ConstantModel:
    def __init__(self, value: float) -> None:
        self.value = value

    def score(self, features: ComplexityFeatures) -> float:
        return self.value


def test_a_plug_in_model_scores_and_hand_weights_explain() -> None:
    payload = chat("Design a sharded, replicated cache and compare consistency trade-offs.")
    verdict = ComplexityClassifier(ConstantModel(0.9)).score(payload)
    assert verdict.score == 0.9
    assert verdict.top_reasons == ComplexityClassifier().score(payload).top_reasons
    assert "reasoning" in verdict.top_reasons
    assert ComplexityClassifier(ConstantModel(math.nan)).score(payload).score == 0.0
    assert ComplexityClassifier(ConstantModel(7.0)).score(payload).score == 1.0
    assert not ComplexityClassifier(ConstantModel(0.2)).is_complex(payload)


def test_logistic_model_rejects_wrong_weights() -> None:
    with pytest.raises(KeyError):
        LogisticModel.from_mapping({"no_such_feature": 1.0}, bias=0.0)
    with pytest.raises(ValueError):
        LogisticModel((1.0,), bias=0.0)
    assert LogisticModel.from_mapping({}, bias=0.0).score(ComplexityFeatures()) == 0.5


def test_the_eval_set_is_well_formed_and_split_by_id_hash() -> None:
    items = {split: load_split(split) for split in ("train", "test")}
    every = items["train"] + items["test"]
    assert len(every) >= 300
    assert len({item["id"] for item in every}) == len(every)
    for split, rows in items.items():
        assert all(split_of(item["id"]) == split for item in rows)
    assert {item["label"] for item in every} == {"simple", "complex"}
    assert all(item["messages"] and item["source_category"] for item in every)
    assert sum("tools" in item for item in every) >= 20
    assert sum(len(item["messages"]) > 2 for item in every) >= 20
    share = sum(labels_of(every)) / len(every)
    assert 0.35 <= share <= 0.65


def test_test_split_precision_and_recall_stay_above_their_floors() -> None:
    items = load_split("test")
    result = metrics(score_items(ComplexityClassifier(), items), labels_of(items), DEFAULT_THRESHOLD)
    assert result.precision >= PRECISION_FLOOR, result
    assert result.recall >= RECALL_FLOOR, result


def test_fitting_on_train_gives_a_monotone_model_that_generalises() -> None:
    train, test = load_split("train"), load_split("test")
    model = fit_logistic([extract_features(request_of(item)) for item in train], labels_of(train))
    weights = dict(zip(FEATURE_NAMES, model.weights, strict=True))
    assert all(weights[name] >= 0 for name in MONOTONE_FEATURES)
    result = metrics(score_items(ComplexityClassifier(model), test), labels_of(test), DEFAULT_THRESHOLD)
    assert result.accuracy >= 0.78, result
