"""``spillgate complexity``: train a complexity model on a team's own evidence, judge one, and size its threshold.

    spillgate complexity train --data FILE.jsonl [--out complexity-model.json]
    spillgate complexity eval [--model FILE|routellm|builtin] [--data FILE.jsonl] [--split test|all]
    spillgate complexity threshold --share 0.1 [--model FILE|routellm]

Evidence files hold one ask a line with a label or both models' results (``policies/complexity_data.py``). Items
are split by a hash of their id: ``train`` fits on the train part and reports on the held-out part, and ``eval``
reads the held-out part by default, so the figures it prints are the ones a model was not fitted on when both
commands see the same file.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from spillgate.policies.complexity import ComplexityClassifier
from spillgate.policies.complexity_curve import RANDOM, RoutingCurve, Summary, routing_curve, summarize
from spillgate.policies.complexity_data import TRAIN_PERCENT, EvidenceError, Record, read_evidence, split_of
from spillgate.policies.complexity_modelfile import ModelFileError, load_model, save_model
from spillgate.policies.complexity_ngram import Example, NgramClassifier, NgramModel, TrainSettings, ask_text, train

REPO_EVIDENCE = Path(__file__).resolve().parents[1] / "policies" / "complexity_eval" / "routellm.jsonl.gz"
"""RouteLLM's evidence as this repository keeps it (not installed with the package)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="complexity_command", required=True)
    train_parser = commands.add_parser("train", help="fit a model file on an evidence file's train split")
    train_parser.add_argument(
        "--data",
        type=Path,
        action="append",
        required=True,
        help="evidence, JSON lines (.jsonl or .jsonl.gz); repeatable",
    )
    train_parser.add_argument("--out", type=Path, default=Path("complexity-model.json"))
    train_parser.add_argument("--train-percent", type=int, default=TRAIN_PERCENT, help="the rest is held out")
    defaults = TrainSettings()
    train_parser.add_argument("--epochs", type=int, default=defaults.epochs)
    train_parser.add_argument("--l1", type=float, default=defaults.l1, help="higher: fewer n-grams kept")
    train_parser.add_argument("--alpha", type=float, default=defaults.alpha, help="learning rate")
    train_parser.set_defaults(handler=run_train)

    eval_parser = commands.add_parser("eval", help="PGR curve, APGR and CPT of a model on held-out evidence")
    eval_parser.add_argument("--model", default="routellm", help="a model file, 'routellm' (shipped) or 'builtin'")
    eval_parser.add_argument("--data", type=Path, default=None, help="default: the repository's RouteLLM evidence")
    eval_parser.add_argument("--split", choices=("test", "all"), default="test")
    eval_parser.add_argument("--train-percent", type=int, default=TRAIN_PERCENT)
    eval_parser.set_defaults(handler=run_eval)

    threshold_parser = commands.add_parser("threshold", help="the score threshold for a target share of complex asks")
    threshold_parser.add_argument("--model", default="routellm")
    threshold_parser.add_argument("--share", type=float, required=True, help="e.g. 0.1: one ask in ten is complex")
    threshold_parser.set_defaults(handler=run_threshold)


def run_train(args: argparse.Namespace) -> int:
    records: list[Record] = []
    for path in args.data:
        part = _read(path)
        if part is None:
            return 2
        records += part
    train_records = [r for r in records if split_of(r.id, args.train_percent) == "train"]
    held_out = [r for r in records if split_of(r.id, args.train_percent) == "test"]
    if not train_records or not any(r.label for r in train_records):
        print("the train split needs at least one ask labelled complex", file=sys.stderr)
        return 2
    settings = TrainSettings(epochs=args.epochs, l1=args.l1, alpha=args.alpha)
    started = time.perf_counter()
    model = train(_examples(train_records), settings)
    seconds = time.perf_counter() - started
    print(f"trained on {len(train_records)} asks in {seconds:.1f} s: {len(model.ngram_weights)} n-gram weights")
    figures: dict[str, dict[str, float]] = {}
    scorer = NgramClassifier(model)
    for name in sorted({r.set for r in held_out}):
        subset = [r for r in held_out if r.set == name]
        print(f"\n{name}: {len(subset)} held-out asks")
        summary = _report(subset, {"model": lambda r: scorer.score(r.payload).score})
        if summary is not None:
            figures[name] = {key: round(value, 4) for key, value in summary._asdict().items()}
    meta = {
        "trained_on": [Path(p).name for p in args.data],
        "train_items": len(train_records),
        "held_out_items": len(held_out),
        "train_percent": args.train_percent,
        "held_out": figures,
        "settings": {"epochs": settings.epochs, "l1": settings.l1, "alpha": settings.alpha},
    }
    model = NgramModel(model.bias, model.cue_weights, model.ngram_weights, model.calibration, meta)
    try:
        save_model(model, args.out)
    except OSError as error:
        print(f"{args.out}: cannot write: {error.strerror}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}; point a route at it with spill.complexity_model: {args.out}")
    return 0


def run_eval(args: argparse.Namespace) -> int:
    data = args.data or REPO_EVIDENCE
    records = _read(data)
    if records is None:
        return 2
    if args.split == "test":
        records = [r for r in records if split_of(r.id, args.train_percent) == "test"]
    score = _scorer(args.model)
    if score is None:
        return 2
    for name in sorted({r.set for r in records}):
        subset = [r for r in records if r.set == name]
        print(f"\n{name}: {len(subset)} asks ({args.split} split of {data})")
        _report(subset, {args.model: score})
    return 0


def run_threshold(args: argparse.Namespace) -> int:
    if not 0 <= args.share <= 1:
        print("--share must be between 0 and 1", file=sys.stderr)
        return 2
    try:
        model = load_model(args.model)
    except ModelFileError as error:
        print(error, file=sys.stderr)
        return 2
    print(f"{model.threshold_for_share(args.share):.4f}")
    return 0


def _read(path: Path) -> list[Record] | None:
    try:
        return read_evidence(path)
    except OSError as error:
        print(f"{path}: cannot read: {error.strerror}", file=sys.stderr)
    except EvidenceError as error:
        print(f"{path}: {error}", file=sys.stderr)
    return None


def _scorer(reference: str) -> Callable[[Record], float] | None:
    if reference == "builtin":
        builtin = ComplexityClassifier()
        return lambda r: builtin.score(r.payload).score
    try:
        classifier = NgramClassifier(load_model(reference))
    except ModelFileError as error:
        print(error, file=sys.stderr)
        return None
    return lambda r: classifier.score(r.payload).score


def _examples(records: Sequence[Record]) -> list[Example]:
    out = []
    for record in records:
        text, features = ask_text(record.payload)
        out.append(Example(text, features, record.label, record.weight))
    return out


def _report(records: Sequence[Record], scorers: dict[str, Callable[[Record], float]]) -> Summary | None:
    """Print the table (random, length only, each scorer) and the first scorer's PGR curve; return its figures.

    Asks on which the models do equally well (a set of easy asks both pass) have no gap to recover: no figures.
    """
    outcomes = [r.outcome for r in records]
    if sum(o.strong for o in outcomes) == sum(o.weak for o in outcomes):
        print("no quality gap between the models on these asks: nothing to recover, no figures")
        return None
    rows: list[tuple[str, Summary]] = [("random (expected)", RANDOM)]
    length = routing_curve([float(len(ask_text(r.payload)[0])) for r in records], outcomes)
    rows.append(("length only", summarize(length)))
    curves: list[RoutingCurve] = []
    for name, score in scorers.items():
        curve = routing_curve([score(r) for r in records], outcomes)
        curves.append(curve)
        rows.append((name, summarize(curve)))
    weak, strong = curves[0].weak_quality, curves[0].strong_quality
    print(f"quality: weak model {weak:.3f}, strong model {strong:.3f}")
    print("| router | APGR | CPT(50%) | CPT(80%) |\n| --- | --- | --- | --- |")
    for name, s in rows:
        print(f"| {name} | {s.apgr:.3f} | {s.cpt50:.1%} | {s.cpt80:.1%} |")
    shares = [i / 10 for i in range(11)]
    print("PGR at strong-call share: " + "  ".join(f"{c:.0%} {curves[0].pgr_at(c):.2f}" for c in shares))
    return rows[2][1]
