"""How well the complexity classifier separates hard asks from easy ones, on prompts the project did not write.

    python -m tests.bench.complexity_eval [--threshold 0.5] [--split test] [--repeats 50] [--fit]
        [--workloads 300] [--cv] [--model FILE|routellm [--share 0.2]]

The set (policies/complexity_eval, built by tests/bench/build_complexity_eval.py from public benchmarks) has three
groups: hard asks (labelled complex), easy asks, and long-context easy asks (an easy ask behind a long system
prompt, chat history, pasted documents, tool definitions or tool results). For the chosen split (default: test) it
prints the figures the unit tests hold the classifier to: recall on hard asks, the false-positive rate on
long-context easy asks, and overall precision, recall and F1; then a threshold sweep, a per-category table, and the
classifier's latency in microseconds (p50/p99 over every item, and for one 64k-character prompt). ``--fit`` also
refits the logistic model on the train split and reports it beside the default and the earlier hand weights.
``--workloads N`` scores N requests of each of the gateway's own bench workloads (gsp, chat, agent) and prints the
share called complex. ``--cv`` reads the train split only: five folds by a hash of the item id, weights refit by
``fit_logistic`` on four and scored on the fifth, so features and cues can be chosen without touching the test split.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from spillgate.policies.complexity import (
    DEFAULT_THRESHOLD,
    FEATURE_NAMES,
    FITTED_WEIGHTS,
    HAND_WEIGHTS,
    ComplexityClassifier,
    LogisticModel,
    extract_features,
    fit_logistic,
)
from spillgate.policies.complexity_modelfile import load_model
from spillgate.policies.complexity_ngram import NgramClassifier

EVAL_DIR = Path(__file__).resolve().parents[2] / "policies" / "complexity_eval"
TRAIN_PERCENT = 60
CV_FOLDS = 5
LONG_PROMPT_CHARS = 64_000
SWEEP = (0.30, 0.35, 0.40, 0.45, 0.50, 0.55, 0.60, 0.65, 0.70)


class Metrics(NamedTuple):
    precision: float
    recall: float
    f1: float
    accuracy: float
    tp: int
    fp: int
    fn: int
    tn: int


def split_of(item_id: str) -> str:
    """``train`` for 60% of ids, ``test`` for the rest, fixed by a hash of the id so adding items moves none."""
    return "train" if int(hashlib.sha256(item_id.encode()).hexdigest()[:8], 16) % 100 < TRAIN_PERCENT else "test"


def fold_of(item_id: str, folds: int = CV_FOLDS) -> int:
    """The cross-validation fold of a train item: a salted hash of its id, so folds do not echo the split."""
    return int(hashlib.sha256(f"cv:{item_id}".encode()).hexdigest()[:8], 16) % folds


def load_split(name: str) -> list[dict[str, Any]]:
    """Items of ``train``, ``test`` or ``all`` (both)."""
    names = ("train", "test") if name == "all" else (name,)
    items = []
    for split in names:
        with open(EVAL_DIR / f"{split}.jsonl", encoding="utf-8") as f:
            items.extend(json.loads(line) for line in f if line.strip())
    return items


@functools.cache
def shared_texts() -> dict[str, Any]:
    """Long texts many items share (an agent's policy and tool schemas), stored once: ``*_ref`` fields name them."""
    with open(EVAL_DIR / "shared.json", encoding="utf-8") as f:
        return json.load(f)


def request_of(item: dict[str, Any]) -> dict[str, Any]:
    """The chat request an item stands for: its messages and, when it has them, its tools, references resolved."""
    shared = shared_texts()
    messages = []
    for message in item["messages"]:
        if "content_ref" in message:
            message = {**message, "content": shared[message["content_ref"]]}
            del message["content_ref"]
        messages.append(message)
    payload: dict[str, Any] = {"messages": messages}
    if "tools" in item:
        payload["tools"] = item["tools"]
    elif "tools_ref" in item:
        payload["tools"] = shared[item["tools_ref"]]
    return payload


def metrics(scores: Sequence[float], labels: Sequence[bool], threshold: float) -> Metrics:
    """Precision, recall, F1 and accuracy of "complex" (score >= threshold) against the labels."""
    tp = fp = fn = tn = 0
    for score, complex_ in zip(scores, labels, strict=True):
        predicted = score >= threshold
        tp += predicted and complex_
        fp += predicted and not complex_
        fn += not predicted and complex_
        tn += not predicted and not complex_
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return Metrics(precision, recall, f1, (tp + tn) / max(1, len(labels)), tp, fp, fn, tn)


def score_items(classifier: Any, items: Sequence[dict[str, Any]]) -> list[float]:
    return [classifier.score(request_of(item)).score for item in items]


def labels_of(items: Sequence[dict[str, Any]]) -> list[bool]:
    return [item["label"] == "complex" for item in items]


def latency_us(score: Callable[[dict[str, Any]], Any], payloads: Sequence[dict[str, Any]], repeats: int) -> list[float]:
    """Per-call microseconds, each payload scored ``repeats`` times, interleaved so caches warm evenly."""
    samples = []
    clock = time.perf_counter
    for _ in range(repeats):
        for payload in payloads:
            started = clock()
            score(payload)
            samples.append((clock() - started) * 1e6)
    return samples


def long_payload(payloads: Sequence[dict[str, Any]], chars: int) -> dict[str, Any]:
    """One user message of ``chars`` characters made of the set's own texts: the cost of a huge prompt."""
    texts = [m["content"] for p in payloads for m in p["messages"] if isinstance(m.get("content"), str)]
    text = "\n".join(texts)
    while len(text) < chars:
        text += "\n" + text
    return {"messages": [{"role": "user", "content": text[:chars]}]}


def print_latency(title: str, samples: Sequence[float]) -> None:
    print(
        f"{title}: p50 {percentile(samples, 0.5):.1f} us  p99 {percentile(samples, 0.99):.1f} us  "
        f"max {max(samples):.1f} us"
    )


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def print_metrics(title: str, m: Metrics, threshold: float) -> None:
    print(
        f"{title} @ {threshold:.2f}: precision {m.precision:.3f}  recall {m.recall:.3f}  F1 {m.f1:.3f}  "
        f"accuracy {m.accuracy:.3f}  (tp {m.tp}, fp {m.fp}, fn {m.fn}, tn {m.tn})"
    )


class GroupRates(NamedTuple):
    hard_recall: float
    easy_fpr: float
    long_context_fpr: float
    counts: dict[str, tuple[int, int]]
    """Group -> (items called complex, items)."""


def group_rates(items: Sequence[dict[str, Any]], scores: Sequence[float], threshold: float) -> GroupRates:
    """Share of each group called complex: recall for hard asks, the false-positive rate for the easy groups."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for item, score in zip(items, scores, strict=True):
        counts[item["group"]][0] += score >= threshold
        counts[item["group"]][1] += 1

    def share(group: str) -> float:
        flagged, total = counts[group]
        return flagged / total if total else 0.0

    return GroupRates(
        share("hard"),
        share("easy"),
        share("long_context_easy"),
        {group: (flagged, total) for group, (flagged, total) in counts.items()},
    )


def print_groups(rates: GroupRates) -> None:
    hard, long, easy = (rates.counts.get(g, (0, 0)) for g in ("hard", "long_context_easy", "easy"))
    print(
        f"recall on hard asks {rates.hard_recall:.3f} ({hard[0]}/{hard[1]})  "
        f"false positives on long-context easy asks {rates.long_context_fpr:.3f} ({long[0]}/{long[1]})  "
        f"on other easy asks {rates.easy_fpr:.3f} ({easy[0]}/{easy[1]})"
    )


def print_sweep(items: Sequence[dict[str, Any]], scores: Sequence[float]) -> None:
    labels = labels_of(items)
    print(
        "\n| threshold | precision | recall | F1 | recall on hard | FPR long-context easy | FPR easy |\n"
        "| --- | --- | --- | --- | --- | --- | --- |"
    )
    for threshold in SWEEP:
        m = metrics(scores, labels, threshold)
        g = group_rates(items, scores, threshold)
        print(
            f"| {threshold:.2f} | {m.precision:.3f} | {m.recall:.3f} | {m.f1:.3f} | {g.hard_recall:.3f} | "
            f"{g.long_context_fpr:.3f} | {g.easy_fpr:.3f} |"
        )


def print_categories(items: Sequence[dict[str, Any]], scores: Sequence[float], threshold: float) -> None:
    groups: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for item, score in zip(items, scores, strict=True):
        groups[(item["group"], item["category"], item["label"])].append(score)
    print(
        "\n| group | category | label | items | called complex | correct | mean score |\n"
        "| --- | --- | --- | --- | --- | --- | --- |"
    )
    for (group, category, label), values in sorted(groups.items()):
        flagged = sum(s >= threshold for s in values)
        correct = flagged if label == "complex" else len(values) - flagged
        print(
            f"| {group} | {category} | {label} | {len(values)} | {flagged} | {correct / len(values):.0%} | "
            f"{statistics.fmean(values):.2f} |"
        )


def workload_requests(kind: str, count: int) -> list[dict[str, Any]]:
    """``count`` request bodies of the gateway's ``kind`` bench workload (gsp, chat or agent), replies filled in."""
    from spillgate.gateway.bench import text
    from spillgate.gateway.bench.config import AgentKnobs, ChatKnobs, GspKnobs
    from spillgate.gateway.bench.workloads import agent_workload, chat_workload, gsp_workload

    salt = "complexity-eval"
    builders = {
        "gsp": lambda: (gsp_workload(GspKnobs(), salt, cycle=True), 0),
        "chat": lambda: (chat_workload(ChatKnobs(), salt, cycle=True), ChatKnobs().output_tokens),
        "agent": lambda: (agent_workload(AgentKnobs(), salt, cycle=True), AgentKnobs().output_tokens),
    }
    workload, reply_tokens = builders[kind]()
    rng = text.rng_for(salt, "reply")

    async def collect() -> list[dict[str, Any]]:
        bodies = []
        while len(bodies) < count:
            spec = await workload.next()
            if spec is None:
                break
            bodies.append({"messages": list(spec.messages), "max_tokens": spec.max_tokens})
            workload.finished(spec, text.text(rng, reply_tokens))
        return bodies

    return asyncio.run(collect())


def print_workloads(classifier: Any, count: int, threshold: float) -> None:
    print()
    for kind in ("gsp", "chat", "agent"):
        scores = [classifier.score(body).score for body in workload_requests(kind, count)]
        flagged = sum(s >= threshold for s in scores)
        print(
            f"workload {kind}: {flagged}/{len(scores)} called complex ({flagged / len(scores):.1%}) @ {threshold:.2f}, "
            f"max score {max(scores):.2f}"
        )


def cross_validate(items: Sequence[dict[str, Any]], folds: int = CV_FOLDS) -> list[float]:
    """Each item's score from a monotone fit on the other folds: held-out scores for a model refit per fold."""
    features = [extract_features(request_of(item)) for item in items]
    labels = labels_of(items)
    fold = [fold_of(item["id"], folds) for item in items]
    scores = [0.0] * len(items)
    for k in range(folds):
        rest = [j for j in range(len(items)) if fold[j] != k]
        model = fit_logistic([features[j] for j in rest], [labels[j] for j in rest])
        for j in range(len(items)):
            if fold[j] == k:
                scores[j] = model.score(features[j])
    return scores


def print_cv(threshold: float) -> None:
    """Cross-validated figures on the train split: the ones to choose changes by."""
    train = load_split("train")
    scores = cross_validate(train)
    print(f"\n{CV_FOLDS}-fold cross-validation on the train split ({len(train)} items), weights refit per fold:")
    print_metrics("cv", metrics(scores, labels_of(train), threshold), threshold)
    print_groups(group_rates(train, scores, threshold))
    print_categories(train, scores, threshold)


def print_weights(model: LogisticModel) -> None:
    terms = "  ".join(f"{name} {weight:+.2f}" for name, weight in zip(FEATURE_NAMES, model.weights, strict=True))
    print(f"  bias {model.bias:+.2f}  {terms}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    parser.add_argument("--split", choices=("train", "test", "all"), default="test")
    parser.add_argument("--repeats", type=int, default=50, help="latency: times each item is scored")
    parser.add_argument("--fit", action="store_true", help="also fit weights on the train split and report them")
    parser.add_argument("--workloads", type=int, default=0, help="score this many gsp, chat and agent requests")
    parser.add_argument("--cv", action="store_true", help="only cross-validate on the train split (no test figures)")
    parser.add_argument("--model", help="a complexity model file, or 'routellm' (shipped)")
    parser.add_argument("--share", type=float, help="with --model: threshold for this share of asks called complex")
    args = parser.parse_args()

    if args.cv:
        print_cv(args.threshold)
        return

    items = load_split(args.split)
    labels = labels_of(items)
    classifier: Any = ComplexityClassifier()
    if args.model:
        model = load_model(args.model)
        classifier = NgramClassifier(model)
        if args.share is not None:
            args.threshold = model.threshold_for_share(args.share)
        print(f"model {args.model}, threshold {args.threshold:.4f}")
    scores = score_items(classifier, items)
    complex_count = sum(labels)
    print(f"{args.split} split: {len(items)} items, {complex_count} complex, {len(items) - complex_count} simple")
    print_metrics("default model", metrics(scores, labels, args.threshold), args.threshold)
    print_groups(group_rates(items, scores, args.threshold))
    print_sweep(items, scores)
    print_categories(items, scores, args.threshold)

    if args.fit:
        train = load_split("train")
        fitted = fit_logistic([extract_features(request_of(i)) for i in train], labels_of(train))
        fitted_scores = score_items(ComplexityClassifier(fitted), items)
        print("\nfitted on train now:")
        print_weights(fitted)
        print("default (fitted, rounded):")
        print_weights(FITTED_WEIGHTS)
        print("hand weights (earlier):")
        print_weights(HAND_WEIGHTS)
        print_metrics("fitted", metrics(fitted_scores, labels, args.threshold), args.threshold)
        print_groups(group_rates(items, fitted_scores, args.threshold))

    if args.workloads:
        print_workloads(classifier, args.workloads, args.threshold)

    payloads = [request_of(item) for item in load_split("all")]
    print()
    print_latency(
        f"latency over {len(payloads)} items x {args.repeats}", latency_us(classifier.score, payloads, args.repeats)
    )
    long_prompt = [long_payload(payloads, LONG_PROMPT_CHARS)]
    print_latency(f"one {LONG_PROMPT_CHARS:,}-char prompt x 200", latency_us(classifier.score, long_prompt, 200))


if __name__ == "__main__":
    main()
