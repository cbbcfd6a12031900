"""How well a score routes between a weak and a strong model, in RouteLLM's terms (arXiv 2406.18665).

Route the asks scoring highest to the strong model and the rest to the weak one. At a share ``c`` of strong calls the
quality is the mean outcome (1/0 correctness, or a judge's score) of the model each ask went to; PGR (performance gap
recovered) is that quality's place between all-weak (0) and all-strong (1). The curve is read at every share
``k/n``; asks with equal scores are split evenly, so a score full of ties (a length bucket, a constant) earns
exactly what a random order of those asks would. APGR is the area under PGR over ``c`` in [0, 1] (random: 0.5);
CPT(x) the least share of strong calls whose PGR reaches ``x`` (random: x).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from typing import NamedTuple


class Outcome(NamedTuple):
    weak: float
    """The weak (self-hosted) model's result on the ask: 1/0 correctness, or a score."""
    strong: float


class RoutingCurve(NamedTuple):
    shares: tuple[float, ...]
    """Share of asks sent to the strong model, 0 to 1 in steps of 1/n."""
    pgr: tuple[float, ...]
    """Performance gap recovered at each share."""
    weak_quality: float
    strong_quality: float

    @property
    def apgr(self) -> float:
        """Area under the PGR curve (trapezoids)."""
        area = 0.0
        for i in range(1, len(self.shares)):
            area += (self.shares[i] - self.shares[i - 1]) * (self.pgr[i] + self.pgr[i - 1]) / 2
        return area

    def cpt(self, target: float) -> float:
        """The least share of strong calls whose PGR reaches ``target``, interpolated between points."""
        previous_share, previous_pgr = self.shares[0], self.pgr[0]
        if previous_pgr >= target:
            return previous_share
        for share, pgr in zip(self.shares[1:], self.pgr[1:], strict=True):
            if pgr >= target:
                if pgr == previous_pgr:
                    return share
                return previous_share + (share - previous_share) * (target - previous_pgr) / (pgr - previous_pgr)
            previous_share, previous_pgr = share, pgr
        return 1.0

    def pgr_at(self, share: float) -> float:
        """PGR at a share of strong calls, interpolated."""
        n = len(self.shares) - 1
        position = min(max(share, 0.0), 1.0) * n
        low = int(position)
        if low >= n:
            return self.pgr[n]
        return self.pgr[low] + (self.pgr[low + 1] - self.pgr[low]) * (position - low)


class Summary(NamedTuple):
    apgr: float
    cpt50: float
    cpt80: float


def routing_curve(scores: Sequence[float], outcomes: Sequence[Outcome]) -> RoutingCurve:
    """The PGR curve of routing by ``scores`` (higher: strong model first); ties are split evenly."""
    n = len(scores)
    if n != len(outcomes):
        raise ValueError("one score per outcome")
    if not n:
        raise ValueError("no asks to route")
    weak_total = sum(o.weak for o in outcomes)
    strong_total = sum(o.strong for o in outcomes)
    gap = strong_total - weak_total
    order = sorted(range(n), key=lambda i: -scores[i])
    gains = [0.0]
    for _, group in groupby(order, key=lambda i: scores[i]):
        members = list(group)
        mean_gain = sum(outcomes[i].strong - outcomes[i].weak for i in members) / len(members)
        gains.extend([mean_gain] * len(members))
    pgr, recovered = [], 0.0
    for gain in gains:
        recovered += gain
        pgr.append(recovered / gap if gap else 0.0)
    return RoutingCurve(tuple(k / n for k in range(n + 1)), tuple(pgr), weak_total / n, strong_total / n)


def summarize(curve: RoutingCurve) -> Summary:
    return Summary(curve.apgr, curve.cpt(0.5), curve.cpt(0.8))


RANDOM = Summary(0.5, 0.5, 0.8)
"""A random router's expected figures: its PGR at share ``c`` is ``c``."""


def threshold_for_share(scores: Sequence[float], share: float) -> float:
    """The score threshold (``score >= threshold`` is complex) that flags about ``share`` of ``scores``."""
    if not scores:
        raise ValueError("no scores to calibrate on")
    if share <= 0:
        return float("inf")
    ordered = sorted(scores, reverse=True)
    count = max(1, min(len(ordered), round(share * len(ordered))))
    return ordered[count - 1]
