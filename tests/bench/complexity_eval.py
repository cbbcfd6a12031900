"""How well the complexity classifier separates "complex" from "simple" requests, and what it costs.

    python -m tests.bench.complexity_eval [--threshold 0.5] [--split test] [--repeats 50] [--fit]

Prints, for the chosen split of ``policies/complexity_eval`` (default: test): precision, recall, F1 and accuracy
for the "complex" class at the threshold, a threshold sweep (0.30..0.70), a per-category breakdown, and the
classifier's latency p50/p99 in microseconds over every item of the set and for one 64k-character prompt.
``--fit`` also fits a logistic model on the train split and reports it beside the hand weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from policies.complexity import (
    DEFAULT_THRESHOLD,
    FEATURE_NAMES,
    HAND_WEIGHTS,
    ComplexityClassifier,
    LogisticModel,
    extract_features,
    fit_logistic,
)

EVAL_DIR = Path(__file__).resolve().parents[2] / "policies" / "complexity_eval"
TRAIN_PERCENT = 60
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


def load_split(name: str) -> list[dict[str, Any]]:
    """Items of ``train``, ``test`` or ``all`` (both)."""
    names = ("train", "test") if name == "all" else (name,)
    items = []
    for split in names:
        with open(EVAL_DIR / f"{split}.jsonl", encoding="utf-8") as f:
            items.extend(json.loads(line) for line in f if line.strip())
    return items


def request_of(item: dict[str, Any]) -> dict[str, Any]:
    """The chat request an item stands for: its messages and, when it has them, its tools."""
    payload: dict[str, Any] = {"messages": item["messages"]}
    if "tools" in item:
        payload["tools"] = item["tools"]
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


def score_items(classifier: ComplexityClassifier, items: Sequence[dict[str, Any]]) -> list[float]:
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


def print_sweep(scores: Sequence[float], labels: Sequence[bool]) -> None:
    print("\n| threshold | precision | recall | F1 | accuracy |\n| --- | --- | --- | --- | --- |")
    for threshold in SWEEP:
        m = metrics(scores, labels, threshold)
        print(f"| {threshold:.2f} | {m.precision:.3f} | {m.recall:.3f} | {m.f1:.3f} | {m.accuracy:.3f} |")


def print_categories(items: Sequence[dict[str, Any]], scores: Sequence[float], threshold: float) -> None:
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for item, score in zip(items, scores, strict=True):
        groups[(item["label"], item["source_category"])].append(score)
    print(
        "\n| category | label | items | called complex | correct | mean score |\n| --- | --- | --- | --- | --- | --- |"
    )
    for (label, category), values in sorted(groups.items()):
        flagged = sum(s >= threshold for s in values)
        correct = flagged if label == "complex" else len(values) - flagged
        print(
            f"| {category} | {label} | {len(values)} | {flagged} | {correct / len(values):.0%} | "
            f"{statistics.fmean(values):.2f} |"
        )


def print_weights(model: LogisticModel) -> None:
    terms = "  ".join(f"{name} {weight:+.2f}" for name, weight in zip(FEATURE_NAMES, model.weights, strict=True))
    print(f"  bias {model.bias:+.2f}  {terms}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    parser.add_argument("--split", choices=("train", "test", "all"), default="test")
    parser.add_argument("--repeats", type=int, default=50, help="latency: times each item is scored")
    parser.add_argument("--fit", action="store_true", help="also fit weights on the train split and report them")
    args = parser.parse_args()

    items = load_split(args.split)
    labels = labels_of(items)
    classifier = ComplexityClassifier()
    scores = score_items(classifier, items)
    complex_count = sum(labels)
    print(f"{args.split} split: {len(items)} items, {complex_count} complex, {len(items) - complex_count} simple")
    print_metrics("hand weights", metrics(scores, labels, args.threshold), args.threshold)
    print_sweep(scores, labels)
    print_categories(items, scores, args.threshold)

    if args.fit:
        train = load_split("train")
        fitted = fit_logistic([extract_features(request_of(i)) for i in train], labels_of(train))
        fitted_scores = score_items(ComplexityClassifier(fitted), items)
        print("\nfitted on train:")
        print_weights(fitted)
        print("hand weights:")
        print_weights(HAND_WEIGHTS)
        print_metrics("fitted", metrics(fitted_scores, labels, args.threshold), args.threshold)
        print_sweep(fitted_scores, labels)

    payloads = [request_of(item) for item in load_split("all")]
    print()
    print_latency(
        f"latency over {len(payloads)} items x {args.repeats}", latency_us(classifier.score, payloads, args.repeats)
    )
    long_prompt = [long_payload(payloads, LONG_PROMPT_CHARS)]
    print_latency(f"one {LONG_PROMPT_CHARS:,}-char prompt x 200", latency_us(classifier.score, long_prompt, 200))


if __name__ == "__main__":
    main()
