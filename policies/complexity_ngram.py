"""A complexity score learned from evidence: a logistic model over the ask's word n-grams and the named cues.

The label is what routing needs: the self-hosted (weak) model got the ask wrong and the frontier (strong) model got
it right. The inputs are the words and word pairs of the ask (the same window the cue model reads, see
``ask_window``) plus the cue model's feature vector, so a topic the weak model keeps failing on and a cue of
complexity both count. Scoring is a set of dictionary look-ups (no numpy, no model download): about a hundred
microseconds for a 2k-token ask. Training is FTRL-proximal (per-coordinate learning rates with an L1 term), in
pure Python: n-grams that do not earn a weight are dropped, which keeps the model file small.
"""

from __future__ import annotations

import itertools
import math
import operator
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spillgate.policies.complexity import (
    EASING_FEATURES,
    FEATURE_NAMES,
    ComplexityFeatures,
    ComplexityVerdict,
    _clamp,
    _sigmoid,
    ask_text,
)

_LETTERS = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_TOKEN_BYTES = bytes((b | 32) if b in _LETTERS else 48 if 48 <= b <= 57 else 32 for b in range(256))
"""Lower-cased ASCII letters, every digit as 0 (a number's length survives, its value does not), the rest blanks."""
MAX_TOKENS = 2000
DENSE_RATE = 10.0
"""The bias and cue weights learn this many times faster than n-gram weights."""
"""At most this many words of an ask are read: the window already bounds a long one."""


def ngrams(text: str) -> set[str]:
    """The ask's words and adjacent word pairs, plus its shape: how many words and numbers, in log-2 buckets."""
    words = text.encode("utf-8", "replace").translate(_TOKEN_BYTES).decode("ascii").split()[:MAX_TOKENS]
    grams = set(words)
    grams.update(map(" ".join, itertools.pairwise(words)))
    size = len(words).bit_length()
    numbers = (" " + " ".join(words)).count(" 0").bit_length()
    grams.update((f"#words{size}", f"#numbers{numbers}", f"#words{size}numbers{numbers}"))
    return grams


@dataclass(frozen=True, slots=True)
class NgramModel:
    """``sigmoid(bias + cue weights . cue vector + sum of the weights of the n-grams present)``."""

    bias: float
    cue_weights: tuple[float, ...]
    ngram_weights: Mapping[str, float]
    calibration: tuple[float, ...] = ()
    """Scores at the 0th..100th percentile of the prompts it was trained on: frontier share to threshold."""
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.cue_weights) != len(FEATURE_NAMES):
            raise ValueError(f"expected {len(FEATURE_NAMES)} cue weights, got {len(self.cue_weights)}")

    def logit_parts(self, text: str, features: ComplexityFeatures) -> tuple[float, list[tuple[float, str]]]:
        """The log-odds, and each term of it (n-grams present, cues) as (contribution, name)."""
        weights = self.ngram_weights
        terms = [(weights[g], g) for g in ngrams(text) & weights.keys()]
        cues = [(w * v, name) for w, v, name in zip(self.cue_weights, features.vector(), FEATURE_NAMES, strict=True)]
        return self.bias + sum(w for w, _ in terms) + sum(w for w, _ in cues), terms + cues

    def score_text(self, text: str, features: ComplexityFeatures) -> float:
        weights = self.ngram_weights
        z = self.bias + sum(map(weights.__getitem__, ngrams(text) & weights.keys()))
        z += sum(map(operator.mul, self.cue_weights, features.vector()))
        return _sigmoid(z)

    def threshold_for_share(self, share: float) -> float:
        """The score from which about ``share`` of prompts like the training set's are called complex."""
        if not self.calibration:
            raise ValueError("the model carries no calibration")
        if share <= 0:
            return 1.0
        if share >= 1:
            return 0.0
        points = len(self.calibration) - 1
        position = (1.0 - share) * points
        low = int(position)
        high = min(low + 1, points)
        return self.calibration[low] + (self.calibration[high] - self.calibration[low]) * (position - low)


@dataclass(frozen=True, slots=True)
class NgramClassifier:
    """Scores requests with an ``NgramModel``: the same interface as ``ComplexityClassifier``."""

    model: NgramModel
    max_reasons: int = 3
    min_contribution: float = 0.3

    def score(self, payload: Any) -> ComplexityVerdict:
        text, features = ask_text(payload)
        z, terms = self.model.logit_parts(text, features)
        strong = sorted((t for t in terms if t[0] >= self.min_contribution), reverse=True)
        return ComplexityVerdict(_clamp(_sigmoid(z)), features, tuple(name for _, name in strong[: self.max_reasons]))

    def is_complex(self, payload: Any, threshold: float) -> bool:
        text, features = ask_text(payload)
        return _clamp(self.model.score_text(text, features)) >= threshold


class Example:
    """One training ask: its n-grams, its cue vector and whether it needs the strong model."""

    __slots__ = ("cues", "grams", "label", "weight")

    def __init__(self, text: str, features: ComplexityFeatures, label: bool, weight: float = 1.0) -> None:
        self.grams = ngrams(text)
        self.cues = features.vector()
        self.label = label
        self.weight = weight


@dataclass(frozen=True, slots=True)
class TrainSettings:
    epochs: int = 6
    alpha: float = 0.02
    beta: float = 1.0
    l1: float = 6.0
    l2: float = 1.0
    min_count: int = 2
    """An n-gram seen in fewer training asks than this gets no weight."""
    use_cues: bool = True
    use_ngrams: bool = True
    seed: int = 0


def train(examples: Sequence[Example], settings: TrainSettings = TrainSettings()) -> NgramModel:
    """Fit by FTRL-proximal over shuffled passes; calibrate the score's percentiles on the training asks.

    The cue vector is centred on its training mean while fitting (the centring is folded into the bias after), and
    the bias and cue weights learn faster than n-gram weights: dense inputs otherwise lag the sparse ones.
    """
    if not examples:
        raise ValueError("no training examples")
    counts: Counter[str] = Counter()
    if settings.use_ngrams:
        for example in examples:
            counts.update(example.grams)
    vocabulary = {g for g, c in counts.items() if c >= settings.min_count}
    cue_keys = [f"\x00cue:{name}" for name in FEATURE_NAMES] if settings.use_cues else []
    means = [sum(e.cues[i] for e in examples) / len(examples) for i in range(len(FEATURE_NAMES))]
    positives = sum(e.label for e in examples)
    signs = {key: (-1 if name in EASING_FEATURES else 1) for key, name in zip(cue_keys, FEATURE_NAMES, strict=False)}
    """A cue of complexity never lowers the score, nor a cue of an easy ask raises it (as in ``fit_logistic``)."""
    z: dict[str, float] = {}
    n: dict[str, float] = {}
    alphas = {True: settings.alpha * DENSE_RATE, False: settings.alpha}
    rng = random.Random(settings.seed)
    order = list(range(len(examples)))

    def weight(key: str) -> float:
        dense = key.startswith("\x00")
        l1 = 0.0 if dense else settings.l1
        zi = z.get(key, 0.0)
        if abs(zi) <= l1:
            return 0.0
        rate = (settings.beta + math.sqrt(n.get(key, 0.0))) / alphas[dense]
        w = -(zi - math.copysign(l1, zi)) / (rate + settings.l2 * (not dense))
        sign = signs.get(key, 0)
        return w if sign == 0 or w * sign > 0 else 0.0

    prior = math.log((positives + 1) / (len(examples) - positives + 1))
    for _ in range(settings.epochs):
        rng.shuffle(order)
        for index in order:
            example = examples[index]
            active = [("\x00bias", 1.0)]
            active += [(k, v - m) for k, v, m in zip(cue_keys, example.cues, means, strict=False) if v - m]
            active += [(g, 1.0) for g in example.grams if g in vocabulary]
            ws = [weight(k) for k, _ in active]
            p = _sigmoid(prior + sum(w * v for w, (_, v) in zip(ws, active, strict=True)))
            g0 = (p - (1.0 if example.label else 0.0)) * example.weight
            for (key, value), w in zip(active, ws, strict=True):
                gradient = g0 * value
                ni = n.get(key, 0.0)
                sigma = (math.sqrt(ni + gradient * gradient) - math.sqrt(ni)) / alphas[key.startswith("\x00")]
                z[key] = z.get(key, 0.0) + gradient - sigma * w
                n[key] = ni + gradient * gradient
    cue_weights = tuple(weight(k) for k in cue_keys) if cue_keys else (0.0,) * len(FEATURE_NAMES)
    bias = prior + weight("\x00bias") - sum(w * m for w, m in zip(cue_weights, means, strict=True))
    grams = {g: round(w, 4) for g in sorted(vocabulary) if (w := weight(g))}
    model = NgramModel(round(bias, 4), tuple(round(w, 4) for w in cue_weights), grams)
    scores = sorted(score_example(model, example) for example in examples)
    return NgramModel(model.bias, model.cue_weights, grams, _percentiles(scores))


def score_example(model: NgramModel, example: Example) -> float:
    """The model's score of a prepared example (what scoring its request would give)."""
    get = model.ngram_weights.get
    z = model.bias + sum(get(g, 0.0) for g in example.grams)
    z += sum(w * v for w, v in zip(model.cue_weights, example.cues, strict=True))
    return _sigmoid(z)


def _percentiles(ordered: Sequence[float], points: int = 100) -> tuple[float, ...]:
    if not ordered:
        return ()
    last = len(ordered) - 1
    return tuple(round(ordered[round(last * i / points)], 6) for i in range(points + 1))


def examples_from(items: Iterable[Mapping[str, Any]]) -> list[Example]:
    """Training asks from evidence items: ``payload`` (a request) and ``label``."""
    out = []
    for item in items:
        text, features = ask_text(item["payload"])
        out.append(Example(text, features, bool(item["label"])))
    return out
