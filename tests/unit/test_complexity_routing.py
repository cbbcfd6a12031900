"""Complexity routing judged on evidence: the PGR curve, evidence files, model files and the shipped model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from spillgate.policies.complexity_curve import Outcome, Summary, routing_curve, summarize, threshold_for_share
from spillgate.policies.complexity_data import EvidenceError, parse_record, read_evidence, split_of
from spillgate.policies.complexity_modelfile import (
    ModelFileError,
    document_of,
    load_model,
    model_from_document,
    route_complexity,
    save_model,
)
from spillgate.policies.complexity_ngram import NgramClassifier, NgramModel, ngrams
from tests.bench.complexity_eval import group_rates, load_split, request_of, workload_requests
from tests.bench.complexity_routellm import EVIDENCE, length_scorer

# Held-out figures of the shipped model (policies/complexity_models/routellm.json) on the test split of RouteLLM's
# evidence, measured when it was trained: MMLU APGR 0.621, CPT(50%) 31.0%; GSM8K APGR 0.623, CPT(50%) 33.5%.
# RouteLLM's best published MMLU router: APGR 0.603, CPT(50%) 35.4%; its best GSM8K router, read off its figure:
# APGR 0.621, CPT(50%) 33.8% (docs/performance.md).
MMLU_APGR_FLOOR = 0.61
MMLU_CPT50_CEILING = 0.33
GSM8K_APGR_FLOOR = 0.61
SHARE = 0.2
"""A route set for one ask in five like the training asks: measured 0.3% of gsp, 1.0% of chat and 0% of agent
requests called complex, and 0 of 96 long-context easy asks."""
WORKLOAD_COMPLEX_CEILING = 0.02
LONG_CONTEXT_FPR_CEILING = 0.05


def outcomes(*pairs: tuple[float, float]) -> list[Outcome]:
    return [Outcome(w, s) for w, s in pairs]


def test_routing_the_asks_the_weak_model_fails_first_recovers_the_gap_fastest() -> None:
    # Two asks only the strong model gets right, two both get right.
    results = outcomes((0, 1), (0, 1), (1, 1), (1, 1))
    best = routing_curve([0.9, 0.8, 0.2, 0.1], results)
    worst = routing_curve([0.1, 0.2, 0.8, 0.9], results)
    assert best.pgr == (0.0, 0.5, 1.0, 1.0, 1.0)
    assert worst.pgr == (0.0, 0.0, 0.0, 0.5, 1.0)
    assert summarize(best).cpt50 == pytest.approx(0.25)
    assert summarize(worst).cpt80 == pytest.approx(0.9)
    assert best.apgr == pytest.approx(0.75)
    assert worst.apgr == pytest.approx(0.25)
    assert (best.weak_quality, best.strong_quality) == (0.5, 1.0)


def test_tied_scores_earn_what_a_random_order_would() -> None:
    results = outcomes((0, 1), (1, 1), (0, 1), (1, 0), (0, 0))
    flat = summarize(routing_curve([0.3] * 5, results))
    assert flat.apgr == pytest.approx(0.5)
    assert flat.cpt50 == pytest.approx(0.5)
    assert flat.cpt80 == pytest.approx(0.8)


def test_a_score_can_be_worse_than_random_and_a_threshold_is_a_share() -> None:
    results = outcomes((1, 0), (0, 1), (0, 1))
    assert routing_curve([1.0, 0.0, 0.5], results).pgr == (0.0, -1.0, 0.0, 1.0)
    assert threshold_for_share([0.1, 0.9, 0.5, 0.7], 0.5) == 0.7
    assert threshold_for_share([0.1, 0.9], 0) == math.inf


def test_evidence_lines_take_a_label_or_both_results() -> None:
    labelled = parse_record('{"prompt": "Prove it.", "label": true}')
    assert labelled.label and labelled.outcome == Outcome(0.0, 1.0)
    assert labelled.payload == {"messages": [{"role": "user", "content": "Prove it."}]}
    scored = parse_record(
        '{"id": "q1", "set": "mt", "messages": [{"role": "user", "content": "hi"}], '
        '"weak_score": 7, "strong_score": 6.5}'
    )
    assert (scored.id, scored.set, scored.label) == ("q1", "mt", False)
    assert parse_record('{"prompt": "a", "label": "simple"}').outcome == Outcome(1.0, 1.0)
    assert split_of("q1") == split_of("q1")
    with pytest.raises(EvidenceError, match="line 3: needs 'label'"):
        parse_record('{"prompt": "a"}', 3)
    with pytest.raises(EvidenceError, match="line 4: needs 'prompt'"):
        parse_record('{"label": 1}', 4)
    with pytest.raises(EvidenceError, match="must both be numbers"):
        parse_record('{"prompt": "a", "weak": 1}')
    with pytest.raises(EvidenceError, match="not JSON"):
        parse_record("{", 1)


def test_a_model_file_round_trips_and_a_bad_one_says_what_is_wrong(tmp_path: Path) -> None:
    model = NgramModel(-1.0, (0.0,) * 15, {"integral": 2.0, "prove that": 1.5}, (0.1, 0.5, 0.9), {"note": "x"})
    path = tmp_path / "m.json"
    save_model(model, path)
    loaded = load_model(path)
    assert loaded == model
    classifier = NgramClassifier(loaded)
    hard = classifier.score({"messages": [{"role": "user", "content": "Prove that the integral converges."}]})
    easy = classifier.score({"messages": [{"role": "user", "content": "Say hello."}]})
    assert hard.score > 0.9 > 0.3 > easy.score
    assert hard.top_reasons[:2] == ("integral", "prove that")
    assert loaded.threshold_for_share(0.5) == pytest.approx(0.5)

    bad = document_of(model)
    for change, message in (
        ({"format": "other"}, "not a complexity model file"),
        ({"version": 9}, "unsupported version"),
        ({"bias": float("nan")}, "'bias' must be a finite number"),
        ({"cue_weights": {"vibes": 1.0}}, "unknown cues"),
        ({"calibration": [0.9, 0.1]}, "must rise"),
        ({"ngram_weights": []}, "'ngram_weights' must be an object"),
    ):
        with pytest.raises(ModelFileError, match=message):
            model_from_document({**bad, **change})
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ModelFileError, match=r"broken\.json: not a JSON model file"):
        load_model(broken)
    with pytest.raises(ModelFileError, match="cannot read"):
        load_model(tmp_path / "missing.json")


def test_ngrams_are_words_pairs_and_the_asks_shape() -> None:
    grams = ngrams("Solve 12 + 7, then PROVE it")
    assert {"solve", "00", "prove it", "solve 00"} <= grams
    assert "#words3" in grams and "#numbers2" in grams


def test_the_shipped_model_beats_length_and_routellms_best_on_held_out_evidence() -> None:
    classifier = NgramClassifier(load_model("routellm"))
    test = [r for r in read_evidence(EVIDENCE) if split_of(r.id) == "test"]
    mmlu = [r for r in test if r.set == "mmlu"]
    gsm8k = [r for r in test if r.set == "gsm8k"]

    def figures(records: list, scores: list[float]) -> Summary:
        return summarize(routing_curve(scores, [r.outcome for r in records]))

    mmlu_model = figures(mmlu, [classifier.score(r.payload).score for r in mmlu])
    gsm8k_model = figures(gsm8k, [classifier.score(r.payload).score for r in gsm8k])
    assert mmlu_model.apgr >= MMLU_APGR_FLOOR and mmlu_model.cpt50 <= MMLU_CPT50_CEILING
    assert gsm8k_model.apgr >= GSM8K_APGR_FLOOR
    assert mmlu_model.apgr > figures(mmlu, length_scorer(mmlu)).apgr + 0.03
    assert gsm8k_model.apgr > figures(gsm8k, length_scorer(gsm8k)).apgr


def test_evidence_file_ids_are_unique_and_contaminated_prompts_are_out() -> None:
    records = read_evidence(EVIDENCE)
    assert len({r.id for r in records}) == len(records)
    counts = {name: sum(r.set == name for r in records) for name in ("mmlu", "gsm8k", "mt_bench")}
    assert counts == {"mmlu": 13932, "gsm8k": 1307, "mt_bench": 72}
    prompts = {r.payload["messages"][0]["content"] for r in records}
    # One of the GSM8K test problems RouteLLM lists as contaminated by its router training data.
    assert not any(p.startswith("A robe takes 2 bolts of blue fiber") for p in prompts)
    assert json.loads(json.dumps(counts)) == counts


def test_the_shipped_model_set_for_a_fifth_of_asks_leaves_gateway_traffic_and_easy_long_asks_alone() -> None:
    model = load_model("routellm")
    classifier = NgramClassifier(model)
    threshold = model.threshold_for_share(SHARE)
    for kind in ("gsp", "chat", "agent"):
        bodies = workload_requests(kind, 300)
        flagged = sum(classifier.score(body).score >= threshold for body in bodies)
        assert flagged / len(bodies) <= WORKLOAD_COMPLEX_CEILING, kind
    items = load_split("test")
    rates = group_rates(items, [classifier.score(request_of(item)).score for item in items], threshold)
    assert rates.long_context_fpr < LONG_CONTEXT_FPR_CEILING


def test_a_route_names_a_model_and_a_share_or_a_threshold() -> None:
    assert route_complexity(None, 0.5, None) == (None, 0.5)
    classifier, threshold = route_complexity("routellm", None, 0.2)
    assert isinstance(classifier, NgramClassifier)
    assert threshold == pytest.approx(load_model("routellm").threshold_for_share(0.2))
    assert route_complexity("routellm", 0.4, None)[1] == 0.4
    with pytest.raises(ModelFileError, match="cannot read"):
        route_complexity("/nonexistent/model.json", None, 0.2)
