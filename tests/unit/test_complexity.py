"""The complexity classifier: what it reads from a request, how its score moves, and how well it separates."""

from __future__ import annotations

import math
from typing import Any

import pytest

from spillgate.policies.complexity import (
    ASK_WHOLE_CHARS,
    DEFAULT_CLASSIFIER,
    DEFAULT_THRESHOLD,
    EASING_FEATURES,
    FEATURE_NAMES,
    FITTED_WEIGHTS,
    HAND_WEIGHTS,
    MONOTONE_FEATURES,
    ComplexityClassifier,
    ComplexityFeatures,
    LogisticModel,
    ask_window,
    extract_features,
    fit_logistic,
    is_complex,
)
from tests.bench.complexity_eval import (
    cross_validate,
    fold_of,
    group_rates,
    labels_of,
    load_split,
    metrics,
    request_of,
    score_items,
    shared_texts,
    split_of,
    workload_requests,
)

# Bounds for the test split of the external set at DEFAULT_THRESHOLD, measured once with the fitted default model:
# precision 0.898, recall 0.760 (every complex item is a hard ask, so this is also the recall on hard asks), F1
# 0.823, and 1 of 96 long-context easy asks called complex (0.010). The recall misses the 0.8 aimed for: Arena-Hard
# and MT-bench hard asks often carry no surface cue. The bounds sit a little past what was measured, so a tweak that
# costs an item or two is allowed, a regression that costs a category is not.
PRECISION_FLOOR = 0.87
HARD_RECALL_FLOOR = 0.73
F1_FLOOR = 0.79
LONG_CONTEXT_FPR_CEILING = 0.03
# Bounds for 5-fold cross-validation on the train split (the figures changes are chosen by): measured recall on hard
# asks 0.825, long-context easy FPR 0.016, other easy FPR 0.100.
CV_HARD_RECALL_FLOOR = 0.80
CV_LONG_CONTEXT_FPR_CEILING = 0.03
CV_EASY_FPR_CEILING = 0.11
WORKLOAD_COMPLEX_CEILING = 0.02
"""Share of the gateway's own gsp, chat and agent bench requests (long shared prefixes) that may leave as complex."""

CODE_BLOCK = "\n```python\n# sort and convert the rows, then say hi\ndef f(rows):\n    return sorted(rows)\n```\n"
TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
    for n in ("search", "read_file", "run_shell")
]
CUE_HEAVY = (
    "Prove the theorem by induction and derive the bound step by step. Compare the algorithm's complexity, "
    r"optimize the distributed cache, debug the Python program: $\frac{1}{x} + \sqrt{x} \le 3$, 3 + 4 = 7. "
)
"""Context stuffed with every kind of cue: it must count for nothing when it is not the ask."""
EASY_ASKS = ("What is the capital of France?", "Summarize the text above in two sentences.", "thanks, that helps!")


def chat(*texts: str, **extra: Any) -> dict[str, Any]:
    """User and assistant turns alternating, starting with the user."""
    roles = ("user", "assistant")
    return {"messages": [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)], **extra}


def test_a_greeting_is_short_simple_and_has_no_cues() -> None:
    features = extract_features(chat("hello! how are you?"))
    assert features.ask_chars == len("hello! how are you?") and features.turns == 1
    assert features.simple_ask >= 1
    cues = features._replace(ask_chars=0, turns=0, simple_ask=0)
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


def test_task_cues_are_read_from_the_prose_not_from_pasted_code() -> None:
    pasted = "Complete this:\n```python\ndef prove_theorem(integer, polynomial):\n    # derive the algorithm\n```"
    features = extract_features(chat(pasted))
    assert features.code_blocks == 1 and features.code_syntax >= 1
    assert features.proof == features.math_terms == features.reasoning == 0
    asked = extract_features(chat("Write a program in Rust that finds every prime number below n."))
    assert asked.code_task >= 2 and asked.math_terms >= 1


def test_asks_to_build_software_are_counted_whatever_the_topic() -> None:
    for ask in (
        "Please write a Python function that returns the longest winning streak.",
        "write a code to generate random password in python",
        "Make code in a synapse notebook that deletes a folder.",
        "Write an R shiny app that visualises the mtcars dataset.",
    ):
        assert extract_features(chat(ask)).build_task == 1, ask
    for ask in (
        "Complete the following Python function:",
        "Write a poem about autumn.",
        "walk make pile win tool",
    ):
        assert extract_features(chat(ask)).build_task == 0, ask


def test_code_in_the_prose_is_counted_apart_from_fenced_code() -> None:
    unfenced = extract_features(chat("let x = { a: 1 }\nx.map(z => z + 1)\nHow to fix this?"))
    assert unfenced.inline_code >= 1 and unfenced.inline_code == unfenced.code_syntax
    fenced = extract_features(chat("Complete this:" + CODE_BLOCK))
    assert fenced.code_syntax >= 1 and fenced.inline_code == 0


def test_math_markup_equations_and_proof_words_are_counted() -> None:
    latex = extract_features(chat(r"Find all $x$ with $\frac{1}{x} + \sqrt{x} \le 3$."))
    assert latex.math_markup >= 3
    arithmetic = extract_features(chat("If 3x + 4 = 19 and y^2 = 2 * 8, what is x + y?"))
    assert arithmetic.arithmetic >= 3
    assert extract_features(chat("((-1 * -6 - -1) - (8 + -7)) =")).arithmetic >= 3
    proof = extract_features(chat("Prove by induction that the sum is n^2, then show that the bound is tight."))
    assert proof.proof >= 3
    assert extract_features(chat("Derive it step by step.")).reasoning >= 2
    assert extract_features(chat("Is the argument, given the premises, deductively valid?")).reasoning >= 3


def test_money_and_dates_do_not_look_like_math() -> None:
    features = extract_features(chat("I paid $4 for tea and $1.50 for a bun on 2024-05-14, then $20 for lunch."))
    assert features.math_markup == 0
    assert features.arithmetic == 0


def test_ordinary_words_that_look_technical_are_not_cues() -> None:
    features = extract_features(chat("The prime minister booked a business class seat; the race was a change of plan."))
    assert features.math_terms == features.code_task == features.reasoning == 0


def test_tools_are_counted_and_tool_results_are_context() -> None:
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
    assert features.turns == 2
    assert features.ask_chars == len("Find the failing test and fix it.")
    assert features.context_chars == len("tests/test_x.py") + len("FAILED")
    assert extract_features({"messages": [], "functions": TOOLS[:1]}).tools == 1


def test_the_ask_is_the_last_user_turn_and_the_rest_is_measured_not_scanned() -> None:
    system = "You must always answer in JSON. Prove every lemma, derive each bound, compare all designs."
    payload = chat("Prove Fermat's last theorem.", "I cannot.", "Derive it step by step.", "Fine.", "e")
    payload["messages"].insert(0, {"role": "system", "content": system})
    features = extract_features(payload)
    assert features.turns == 5
    assert features.ask_chars == 1
    assert features.context_chars == sum(len(m["content"]) for m in payload["messages"][:-1])
    assert features.proof == features.reasoning == features.constraints == 0


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
    assert features.ask_chars == len("Prove that\n$\\sqrt{2}$ is irrational.")
    assert features.proof >= 1 and features.math_markup >= 1
    assert features.context_chars == 0


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


def test_a_long_last_turn_is_read_at_its_ends_and_the_rest_is_context() -> None:
    filler = "The quick brown fox jumps over the lazy dog. " * 2000
    features = extract_features(chat(filler + "Prove that the lemma holds."))
    assert features.ask_chars + features.context_chars == len(filler) + len("Prove that the lemma holds.")
    assert features.ask_chars < 1300
    assert features.proof >= 2
    buried = extract_features(chat(filler[:40_000] + "Prove the lemma. " + filler[:40_000]))
    assert buried.proof == 0


def test_the_window_keeps_the_instruction_and_the_question_not_the_pasted_middle() -> None:
    article = "\n\n".join(f"Part {i}: the theorem, its proof and the algorithm are told here." for i in range(60))
    window = ask_window("Summarize this article:\n" + article)
    assert window == "Summarize this article:\n" + article.rsplit("\n\n", 1)[1]
    assert ask_window(article + "\n\nQuestion: who wrote it?").endswith("\nQuestion: who wrote it?")
    assert ask_window("short ask") == "short ask"
    assert len(ask_window("x" * 10_000)) <= 1300


def padded(ask: str, how: str) -> dict[str, Any]:
    """``ask`` behind thousands of characters of cue-heavy context, the way RAG, chat and pasted documents send it."""
    context = CUE_HEAVY * 40
    if how == "system":
        return {"messages": [{"role": "system", "content": context}, {"role": "user", "content": ask}]}
    if how == "history":
        return chat(*([CUE_HEAVY] * 30), ask)
    if how == "tool results":
        return {
            "messages": [
                {"role": "system", "content": "You are an agent."},
                {"role": "user", "content": "Look it up."},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "a"}]},
                {"role": "tool", "tool_call_id": "a", "content": context},
                {"role": "user", "content": ask},
            ]
        }
    documents = "\n\n".join(f"Document {i}:\n{CUE_HEAVY * 4}" for i in range(10))
    return chat(f"{documents}\n\n{ask}")


@pytest.mark.parametrize("how", ["system", "history", "tool results", "pasted document"])
@pytest.mark.parametrize("ask", EASY_ASKS)
def test_a_long_context_with_an_easy_ask_is_not_complex(ask: str, how: str) -> None:
    payload = padded(ask, how)
    assert sum(len(m.get("content") or "") for m in payload["messages"]) > 4000
    assert not is_complex(payload)
    assert extract_features(payload).context_chars > 4000


def test_padding_context_never_raises_the_score_much() -> None:
    """Over the set's own easy asks: context in other messages changes nothing, pasted before the ask little."""
    classifier = ComplexityClassifier()
    easy = [i for i in load_split("train") if i["group"] == "easy" and len(i["messages"]) == 1]
    assert len(easy) >= 100
    for item in easy:
        ask = item["messages"][0]["content"]
        bare = classifier.score(chat(ask)).score
        for how in ("system", "history", "tool results"):
            assert classifier.score(padded(ask, how)).score == pytest.approx(bare), (item["id"], how)
        if "\n\n" not in ask and len(ask) <= 800:
            assert classifier.score(padded(ask, "pasted document")).score <= bare + 0.05, item["id"]


def test_many_tool_definitions_do_not_make_an_easy_ask_complex() -> None:
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "description": CUE_HEAVY, "parameters": {}}}
        for i in range(64)
    ]
    for ask in EASY_ASKS:
        assert not is_complex(chat(ask, tools=tools))


def eval_payloads() -> list[dict[str, Any]]:
    """Every ninth train item: a spread over the set's categories."""
    return [request_of(item) for item in load_split("train")[::9]]


def last_user_text(payload: dict[str, Any]) -> str:
    return next(m.get("content") or "" for m in reversed(payload["messages"]) if m["role"] == "user")


def with_code_block(payload: dict[str, Any]) -> dict[str, Any]:
    messages = [dict(m) for m in payload["messages"]]
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    messages[last]["content"] = (messages[last]["content"] or "") + CODE_BLOCK
    return {**payload, "messages": messages}


def test_adding_a_code_block_never_lowers_the_score() -> None:
    """For asks read whole; a long last turn is read at its ends, and a block appended to it becomes its end."""
    classifier = ComplexityClassifier()
    short = [p for p in eval_payloads() if len(last_user_text(p)) + len(CODE_BLOCK) <= ASK_WHOLE_CHARS]
    assert len(short) >= 40
    for payload in [chat("hi"), chat("Translate 'cat' into German."), *short]:
        before = classifier.score(payload).score
        assert classifier.score(with_code_block(payload)).score >= before, payload


def test_adding_tools_never_lowers_the_score() -> None:
    classifier = ComplexityClassifier()
    for payload in [chat("hi"), *eval_payloads()]:
        before = classifier.score(payload).score
        more = [*payload.get("tools", []), *TOOLS]
        assert classifier.score({**payload, "tools": more}).score >= before, payload


def test_cues_of_complexity_have_non_negative_weights() -> None:
    for model in (FITTED_WEIGHTS, HAND_WEIGHTS):
        weights = dict(zip(FEATURE_NAMES, model.weights, strict=True))
        assert all(weights[name] >= 0 for name in MONOTONE_FEATURES)
        assert all(weights[name] <= 0 for name in EASING_FEATURES)
    assert dict(zip(FEATURE_NAMES, HAND_WEIGHTS.weights, strict=True))["simple_ask"] < 0


def test_the_default_weights_are_the_monotone_fit_on_train() -> None:
    """The shipped weights are reproducible: a refit on the train split gives them back, up to rounding."""
    train = load_split("train")
    model = fit_logistic([extract_features(request_of(item)) for item in train], labels_of(train))
    assert model.bias == pytest.approx(FITTED_WEIGHTS.bias, abs=0.01)
    assert model.weights == pytest.approx(FITTED_WEIGHTS.weights, abs=0.01)
    assert DEFAULT_CLASSIFIER.model is FITTED_WEIGHTS


def test_an_easing_cue_is_never_fitted_to_raise_the_score() -> None:
    samples = [ComplexityFeatures(simple_ask=1), ComplexityFeatures(simple_ask=1), ComplexityFeatures()]
    model = fit_logistic(samples, [True, True, False])
    assert dict(zip(FEATURE_NAMES, model.weights, strict=True))["simple_ask"] == 0.0
    free = fit_logistic(samples, [True, True, False], monotone=False)
    assert dict(zip(FEATURE_NAMES, free.weights, strict=True))["simple_ask"] > 0


def test_cross_validation_on_train_holds_its_figures() -> None:
    """The protocol changes are chosen by: 5 folds of the train split by id hash, weights refit on each."""
    train = load_split("train")
    folds = {fold_of(item["id"]) for item in train}
    assert folds == set(range(5))
    scores = cross_validate(train)
    groups = group_rates(train, scores, DEFAULT_THRESHOLD)
    assert groups.hard_recall >= CV_HARD_RECALL_FLOOR, groups
    assert groups.long_context_fpr <= CV_LONG_CONTEXT_FPR_CEILING, groups
    assert groups.easy_fpr <= CV_EASY_FPR_CEILING, groups


def test_the_ask_length_alone_never_makes_a_request_complex() -> None:
    for words in ("lorem ipsum dolor sit amet ", "the cat sat on the mat and "):
        assert DEFAULT_CLASSIFIER.score(chat(words * 1000)).score < 0.4


def test_the_threshold_decides() -> None:
    hard = chat(r"Prove that $\sum_{k=1}^{n} k^3 = \left(\frac{n(n+1)}{2}\right)^2$ and derive a bound step by step.")
    easy = chat("hi there!")
    assert is_complex(hard) and not is_complex(easy)
    score = ComplexityClassifier().score(hard).score
    assert is_complex(hard, threshold=score) and not is_complex(hard, threshold=score + 1e-9)
    assert is_complex(easy, threshold=0.0) and not is_complex(hard, threshold=1.01)
    assert DEFAULT_THRESHOLD == 0.5


def test_the_gateway_tests_prompts_still_route_as_they_expect() -> None:
    """The prompts tests/gateway and tests/dashboard send to a hybrid route, at its threshold of 0.5."""
    proof = (
        "Prove rigorously, step by step, that for every integer n >= 1 the sum of the first n odd numbers is n^2, "
        "then derive a closed form for the sum of squares and compare and contrast induction with a telescoping "
        "argument. Show every step of the derivation and justify each lemma."
    )
    assert is_complex(chat(proof)) and is_complex(chat(proof + " Twice."))
    for easy in ("Say hello to my friend.", "hello there", "hi", "Name three colours.", "Count to five.", "Warm up."):
        assert not is_complex(chat(easy)), easy
    for easy in ("Quick question: what is 2 + 2?", "Tell me a long story.", "tell me a long story " * 50):
        assert not is_complex(chat(easy)), easy


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
    assert len(every) >= 800
    assert len({item["id"] for item in every}) == len(every)
    for split, rows in items.items():
        assert all(split_of(item["id"]) == split for item in rows)
    assert {item["label"] for item in every} == {"simple", "complex"}
    assert {item["group"] for item in every} == {"hard", "easy", "long_context_easy"}
    assert all((item["group"] == "hard") == (item["label"] == "complex") for item in every)
    for item in every:
        assert item["messages"] and item["category"] and item["rule"]
        assert item["source"]["dataset"] and item["source"]["file"] and item["source"]["record"]
    shared = shared_texts()
    assert all(item["tools_ref"] in shared for item in every if "tools_ref" in item)
    assert all(m["content_ref"] in shared for item in every for m in item["messages"] if "content_ref" in m)
    assert sum("tools" in item or "tools_ref" in item for item in every) >= 60
    assert sum(len(item["messages"]) > 2 for item in every) >= 60
    assert sum(item["group"] == "long_context_easy" for item in every) >= 200
    share = sum(labels_of(every)) / len(every)
    assert 0.35 <= share <= 0.65


def test_long_context_items_carry_a_long_context() -> None:
    for item in load_split("all"):
        if item["group"] == "long_context_easy":
            assert extract_features(request_of(item)).context_chars >= 2000 or len(item.get("tools", [])) > 1, item[
                "id"
            ]


def test_test_split_figures_stay_within_their_bounds() -> None:
    items = load_split("test")
    scores = score_items(ComplexityClassifier(), items)
    result = metrics(scores, labels_of(items), DEFAULT_THRESHOLD)
    groups = group_rates(items, scores, DEFAULT_THRESHOLD)
    assert result.precision >= PRECISION_FLOOR, result
    assert result.f1 >= F1_FLOOR, result
    assert groups.hard_recall >= HARD_RECALL_FLOOR, groups
    assert groups.long_context_fpr <= LONG_CONTEXT_FPR_CEILING, groups


@pytest.mark.parametrize("kind", ["gsp", "chat", "agent"])
def test_the_gateways_shared_prefix_workloads_do_not_leave_as_complex(kind: str) -> None:
    bodies = workload_requests(kind, 200)
    flagged = sum(DEFAULT_CLASSIFIER.is_complex(body) for body in bodies)
    assert flagged <= WORKLOAD_COMPLEX_CEILING * len(bodies), flagged


def test_fitting_on_train_gives_a_monotone_model_that_generalises() -> None:
    train, test = load_split("train"), load_split("test")
    model = fit_logistic([extract_features(request_of(item)) for item in train], labels_of(train))
    weights = dict(zip(FEATURE_NAMES, model.weights, strict=True))
    assert all(weights[name] >= 0 for name in MONOTONE_FEATURES)
    result = metrics(score_items(ComplexityClassifier(model), test), labels_of(test), DEFAULT_THRESHOLD)
    assert result.accuracy >= 0.85, result
