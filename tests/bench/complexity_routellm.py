"""Complexity routing judged on RouteLLM's evidence: PGR curve, APGR, CPT(50%) and CPT(80%) per set and router.

    python -m tests.bench.complexity_routellm [--curve] [--cross] [--latency] [--cv] [--l1 6 --alpha 0.02 ...]

The evidence (policies/complexity_eval/routellm.jsonl.gz, built by tests/bench/build_routellm_evidence.py) is
MMLU, GSM8K and MT-bench prompts with Mixtral-8x7B's (weak) and GPT-4's (strong) results, contaminated prompts left
out. Items are split by a hash of their id (60% train, 40% test); every router that learns is fitted on the train
split of MMLU, GSM8K and MT-bench together and scored on each set's test split. Rows: a random router (its expected
figures), length only (the ask's characters), the built-in cue score, the cue model refit on the evidence labels, a
logistic model on word n-grams, the same with the cues, and RouteLLM's published routers (their paper's figures on
the full sets, cited in ``PUBLISHED``). ``--cross`` trains on one set and scores the others; ``--curve`` prints PGR
at every tenth of strong calls; ``--latency`` times the shipped model on a 2k-token ask.

``--cv`` reads the train split only: ``CV_FOLDS`` folds by a salted hash of the id, repeated with each salt in
``CV_SALTS``, the shipped recipe (easy asks included, the settings given) trained on the other folds and scored on
each; it prints each set's mean APGR, CPT(50%) and CPT(80%) over the folds, and length only's on the same folds.
Settings and features are to be chosen by this table, not by the held-out one.

``--write-model PATH`` trains the shipped model (policies/complexity_models/routellm.json) the way it was made:
``spillgate complexity train`` on the evidence plus the easy asks of the category set
(policies/complexity_eval/train.jsonl and test.jsonl, groups ``easy`` and ``long_context_easy``: translations,
summaries, greetings, lookups behind long contexts) as asks both models pass, weighted ``EASY_WEIGHT``. Without them
the evidence says nothing about chat traffic, and a threshold set for one MMLU ask in five calls a fifth of chat
turns complex too. Their split is by the same id hash, so only their train part is learned from.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from spillgate.gateway.cli import main as cli_main
from spillgate.policies.complexity import ASK_WHOLE_CHARS, ComplexityClassifier, extract_features, fit_logistic
from spillgate.policies.complexity_curve import RANDOM, Outcome, Summary, routing_curve, summarize
from spillgate.policies.complexity_data import Record, read_evidence, split_of
from spillgate.policies.complexity_modelfile import load_model
from spillgate.policies.complexity_ngram import (
    Example,
    NgramClassifier,
    NgramModel,
    TrainSettings,
    ask_text,
    score_example,
    train,
)
from tests.bench.complexity_eval import EVAL_DIR, load_split, request_of

EVIDENCE = EVAL_DIR / "routellm.jsonl.gz"
SETS = ("mmlu", "gsm8k", "mt_bench")
EASY_WEIGHT = 6.0
EASY_GROUPS = ("easy", "long_context_easy")
CV_FOLDS = 5
CV_SALTS = (0, 1)

Scorer = Callable[[Sequence[Record]], list[float]]


def load(path: Path = EVIDENCE) -> list[Record]:
    return read_evidence(path)


def examples(records: Sequence[Record]) -> list[Example]:
    out = []
    for record in records:
        text, features = ask_text(record.payload)
        out.append(Example(text, features, record.label, record.weight))
    return out


def length_scorer(records: Sequence[Record]) -> list[float]:
    return [float(len(ask_text(r.payload)[0])) for r in records]


def builtin_scorer(records: Sequence[Record]) -> list[float]:
    classifier = ComplexityClassifier()
    return [classifier.score(r.payload).score for r in records]


def cue_refit(train_records: Sequence[Record]) -> Scorer:
    model = fit_logistic([extract_features(r.payload) for r in train_records], [r.label for r in train_records])
    return lambda records: [model.score(extract_features(r.payload)) for r in records]


def ngram_router(train_records: Sequence[Record], settings: TrainSettings) -> tuple[NgramModel, Scorer]:
    model = train(examples(train_records), settings)
    return model, lambda records: [score_example(model, e) for e in examples(records)]


def by_set(records: Sequence[Record], name: str) -> list[Record]:
    return [r for r in records if r.set == name]


def figures(scores: Sequence[float], records: Sequence[Record]) -> Summary:
    return summarize(routing_curve(scores, [r.outcome for r in records]))


# RouteLLM's published router figures (Ong et al., "RouteLLM: Learning to Route LLMs with Preference Data",
# arXiv 2406.18665), GPT-4-1106-preview vs Mixtral-8x7B on the same decontaminated sets, whole sets, APGR by
# trapezoids over its router's threshold bins. MMLU: the best value of each column among its routers trained on Arena
# preferences plus MMLU's golden labels (its MMLU table), as quoted in a secondary write-up; MT-bench: matrix
# factorisation trained on Arena preferences plus GPT-4 judge labels, its headline result. GSM8K: the paper's table
# was not retrievable here; these are read off the GSM8K figure in RouteLLM's repository (assets/gsm8k.png: PGR at
# every tenth of GPT-4 calls for its routers trained on augmented data), best router (causal LLM), by locating its
# markers in the image's pixels against the axes, so within about a point of the plotted values.
PUBLISHED: dict[str, dict[str, Summary]] = {
    "mmlu": {"best of its D_arena + D_gold routers, per column": Summary(0.603, 0.354, 0.703)},
    "gsm8k": {"causal LLM, augmented data (read off its figure)": Summary(0.621, 0.338, 0.634)},
    "mt_bench": {"matrix factorisation, D_arena + D_judge": Summary(0.802, 0.134, 0.313)},
}


def print_table(title: str, rows: Sequence[tuple[str, Summary]]) -> None:
    print(f"\n{title}\n\n| router | APGR | CPT(50%) | CPT(80%) |\n| --- | --- | --- | --- |")
    for name, s in rows:
        print(f"| {name} | {s.apgr:.3f} | {s.cpt50:.1%} | {s.cpt80:.1%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--curve", action="store_true")
    parser.add_argument("--cross", action="store_true")
    parser.add_argument("--latency", action="store_true")
    parser.add_argument("--cv", action="store_true", help="cross-validate the recipe on the train split only")
    parser.add_argument("--l1", type=float, default=TrainSettings().l1)
    parser.add_argument("--l2", type=float, default=TrainSettings().l2)
    parser.add_argument("--alpha", type=float, default=TrainSettings().alpha)
    parser.add_argument("--epochs", type=int, default=TrainSettings().epochs)
    parser.add_argument("--write-model", type=Path, help="train the shipped model and write it here")
    args = parser.parse_args()
    if args.write_model:
        write_model(args.write_model)
        return
    if args.latency:
        print_latency(load_model("routellm"))
        return
    base = TrainSettings(epochs=args.epochs, alpha=args.alpha, l1=args.l1, l2=args.l2)
    records = load()
    if args.cv:
        print_cv(records, base)
        return
    train_records = [r for r in records if split_of(r.id) == "train"]
    test_records = [r for r in records if split_of(r.id) == "test"]
    print(f"{len(records)} items: {len(train_records)} train, {len(test_records)} test")
    started = time.perf_counter()
    routers: dict[str, Scorer] = {"length only": length_scorer, "built-in cues": builtin_scorer}
    routers["cues refit"] = cue_refit(train_records)
    _, routers["n-grams"] = ngram_router(train_records, dataclasses.replace(base, use_cues=False))
    model, routers["n-grams + cues"] = ngram_router(train_records, base)
    print(f"trained in {time.perf_counter() - started:.0f} s; n-gram model: {len(model.ngram_weights)} weights")
    shipped = NgramClassifier(load_model("routellm"))
    routers["shipped 'routellm' (n-grams + cues + easy asks)"] = lambda rs: [shipped.score(r.payload).score for r in rs]
    for name in SETS:
        subset = by_set(test_records, name)
        rows = [("random (expected)", RANDOM)]
        rows += [(router, figures(score(subset), subset)) for router, score in routers.items()]
        rows += [(f"RouteLLM {router} (published)", s) for router, s in PUBLISHED.get(name, {}).items()]
        print_table(f"{name}: test split, {len(subset)} items", rows)
        if args.curve:
            curve = routing_curve(routers["n-grams + cues"](subset), [r.outcome for r in subset])
            points = "  ".join(f"{c:.0%}:{curve.pgr_at(c):.2f}" for c in [i / 10 for i in range(11)])
            print(f"PGR by strong-call share (n-grams + cues): {points}")
    if args.cross:
        for source in ("mmlu", "gsm8k"):
            fitted = [r for r in train_records if r.set == source]
            _, scorer = ngram_router(fitted, base)
            refit = cue_refit(fitted)
            for target in SETS:
                if target == source:
                    continue
                subset = by_set(records, target)
                print_table(
                    f"trained on {source} (train split), scored on all of {target} ({len(subset)} items)",
                    [
                        ("n-grams + cues", figures(scorer(subset), subset)),
                        ("cues refit", figures(refit(subset), subset)),
                    ],
                )


def cv_fold(item_id: str, salt: int) -> int:
    """The fold of a train item under one salt: a hash of the id, so folds neither echo the split nor each other."""
    return int(hashlib.sha256(f"cv{salt}:{item_id}".encode()).hexdigest()[:8], 16) % CV_FOLDS


def print_cv(records: Sequence[Record], settings: TrainSettings) -> None:
    """Each set's figures over the folds of the train split, for the recipe and for length only."""
    train_records = [r for r in records if split_of(r.id) == "train"]
    easy = easy_records("train")
    prepared, easy_prepared = examples(train_records), examples(easy)
    lengths = length_scorer(train_records)
    found: dict[tuple[str, str], list[Summary]] = {}
    for salt in CV_SALTS:
        folds = [cv_fold(r.id, salt) for r in train_records]
        for k in range(CV_FOLDS):
            model = train([e for e, f in zip(prepared, folds, strict=True) if f != k] + easy_prepared, settings)
            for name in SETS:
                held = [i for i, r in enumerate(train_records) if r.set == name and folds[i] == k]
                held_outcomes = [train_records[i].outcome for i in held]
                scores = {
                    "model": [score_example(model, prepared[i]) for i in held],
                    "length only": [lengths[i] for i in held],
                }
                for who, scored in scores.items():
                    found.setdefault((name, who), []).append(summarize(routing_curve(scored, held_outcomes)))
    rows = [
        (f"{name}, {who}", Summary(*(statistics.mean(getattr(s, f) for s in runs) for f in Summary._fields)))
        for (name, who), runs in found.items()
    ]
    title = (
        f"{len(train_records)} train items + {len(easy)} easy asks, mean over {CV_FOLDS} folds x {len(CV_SALTS)} salts"
    )
    print_table(f"{title}; {settings}", rows)
    spread = ", ".join(
        f"{name} {who} {statistics.pstdev(s.cpt50 for s in runs):.1%}" for (name, who), runs in found.items()
    )
    print(f"CPT(50%) standard deviation over the folds: {spread}")


def easy_records(split: str) -> list[Record]:
    """The category set's easy asks of one split as records both models pass, weighted ``EASY_WEIGHT``."""
    return [
        Record(item["id"], "easy_asks", request_of(item), Outcome(1.0, 1.0), EASY_WEIGHT)
        for item in load_split("all")
        if item["group"] in EASY_GROUPS and split_of(item["id"]) == split
    ]


def write_easy_asks(path: Path) -> int:
    """The category set's easy asks as evidence lines both models pass, weighted ``EASY_WEIGHT``."""
    lines = []
    for item in load_split("all"):
        if item["group"] in EASY_GROUPS:
            payload = request_of(item)
            line = {"id": item["id"], "set": "easy_asks", "label": False, "weight": EASY_WEIGHT, **payload}
            lines.append(json.dumps(line, ensure_ascii=False))
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


def write_model(out: Path) -> None:
    with tempfile.TemporaryDirectory() as folder:
        easy = Path(folder) / "easy_asks.jsonl"
        print(f"{write_easy_asks(easy)} easy asks")
        code = cli_main(["complexity", "train", "--data", str(EVIDENCE), "--data", str(easy), "--out", str(out)])
    if code:
        raise SystemExit(code)


def print_latency(model: NgramModel) -> None:
    """Microseconds per decision on asks of about 2,000 tokens (1,500 words of the evidence's own prompts), and on
    1,500-character asks: the most text a decision reads, since a longer last turn is read at its ends only. Wall
    time, and the thread's CPU time: on a shared machine the wall clock's tail is time spent waiting for a core."""
    records = load()
    asks = []
    for start in range(0, 2000, 100):
        words = " ".join(r.payload["messages"][0]["content"] for r in records[start : start + 100]).split()
        asks.append(" ".join(words[:1500]))
    classifiers = {"shipped model": NgramClassifier(model), "built-in cues": ComplexityClassifier()}
    for title, texts in (("2k-token asks", asks), ("1,500-char asks", [a[:ASK_WHOLE_CHARS] for a in asks])):
        payloads = [{"messages": [{"role": "user", "content": text}]} for text in texts]
        for name, classifier in classifiers.items():
            wall, cpu = [], []
            for _ in range(100):
                for payload in payloads:
                    started, started_cpu = time.perf_counter_ns(), time.thread_time_ns()
                    classifier.score(payload)
                    cpu.append((time.thread_time_ns() - started_cpu) / 1e3)
                    wall.append((time.perf_counter_ns() - started) / 1e3)
            print(
                f"{title}, {name} ({len(payloads)} x 100): wall p50 {_pct(wall, 0.5):.0f} us, p99 "
                f"{_pct(wall, 0.99):.0f} us; CPU p50 {_pct(cpu, 0.5):.0f} us, p99 {_pct(cpu, 0.99):.0f} us"
            )


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


if __name__ == "__main__":
    main()
