"""Learning how fast a replica prefills, and its fixed time to a first token, from the TTFTs the gateway sees.

A request's first token comes once the replica has prefilled what was ahead of it and then the request's own
uncached prompt: ``TTFT = overhead + (tokens ahead + own uncached tokens) / rate``, where the tokens ahead are
the gateway's own count of uncached prompt tokens still in prefill there when it sent the request (the figure
routing predicts from, so the fit calibrates those predictions). Learning from every request, not only from
those that found the replica idle, keeps the line measured under load, when batching makes a replica prefill
faster than an idle one and busy replicas are seldom idle.

A least-squares line through the recent samples gives both: the rate (the slope's inverse) and the overhead
(the intercept: scheduling, one forward pass's floor, the network). A rate alone, fitted through the origin,
would put the overhead into the rate and mispredict every size but the usual one. While the recent samples
are all about the same size the slope cannot be told apart from the overhead: the last rate is kept and the
overhead alone is refitted (or, if that rate is too slow for what was seen, the plain tokens/TTFT ratio is
taken), so requests like those are predicted exactly. Until enough samples exist, the configured prior rate
is used with no overhead.

Under load that line is not enough. The tokens ahead are the gateway's count at the moment it sent the
request, and part of them is already being computed: an error in the line's x, which flattens the fitted slope
(on ``chat`` traces, a rate 1.5-2x too fast, with the overhead absorbing the rest). That is harmless for a
request alone but predicts a queue of ten prompts at half its real wait. So once requests queue, the rate is
measured directly instead: a request that was already waiting when its replica's previous first token came
back had that replica busy for it from then until its own first token. The sum of such requests' uncached
tokens over the sum of those intervals is how fast the replica drains a queue, decode steps and pass floors
included, which is what a prediction from a queue needs. The overhead is then the median of what that rate
leaves unexplained in the TTFTs of requests that found nothing ahead (whose x is exact).

That overhead is measured twice, as soon as a couple of such requests exist (in either regime): for a replica
that was idle and for one that was decoding other requests. A request sent to a decoding replica waits for
the pass in progress, and under an overlap scheduler (SGLang's default) for the pass formed during it, before
its own prefill runs: tens of milliseconds on a big batch, which one overhead for both would spread as
errors of both signs over every prefix hit.

The gateway reports each request at its first token, in its own units (uncached tokens as it estimated them
when routing): those are the units predictions are made in, and a rate learned a whole reply sooner follows a
burst while it lasts.
"""

from __future__ import annotations

import statistics
from collections import deque

_WINDOW = 64
_MIN_SAMPLES = 8
_MIN_SPREAD_TOKENS = 256.0
_MIN_ALONE = 2
"""Requests that found nothing ahead before the overhead is measured on them: their x is exact, so a few do."""


class PrefillRateEstimator:
    __slots__ = ("_alone", "_alone_busy", "_drains", "_samples", "busy_overhead_s", "overhead_s", "prior", "rate")

    def __init__(self, prior_tokens_per_s: float) -> None:
        self.prior = prior_tokens_per_s
        self.rate = prior_tokens_per_s
        self.overhead_s = 0.0
        self.busy_overhead_s = 0.0
        self._samples: deque[tuple[float, float]] = deque(maxlen=_WINDOW)
        self._alone: deque[tuple[float, float]] = deque(maxlen=_WINDOW)
        self._alone_busy: deque[tuple[float, float]] = deque(maxlen=_WINDOW)
        self._drains: deque[tuple[float, float]] = deque(maxlen=_WINDOW)

    def observe(
        self,
        ahead_tokens: int,
        own_tokens: int,
        ttft_s: float,
        drain_s: float | None = None,
        *,
        drained_tokens: int | None = None,
        busy: bool = False,
    ) -> None:
        """One request: the uncached tokens the gateway had in prefill ahead of it when it was sent, its own
        uncached tokens, and its TTFT from being sent. ``drain_s``: when it was waiting as its replica's previous
        first token came back, the seconds from then to its own, in which the replica prefilled
        ``drained_tokens`` (its own, by default; with other gateway processes, theirs of that time too).
        ``busy``: other requests were in flight there when it was sent."""
        drained = own_tokens if drained_tokens is None else drained_tokens
        if drain_s is not None and own_tokens > 0 and drain_s > 0:
            self._drains.append((float(drained), drain_s))
        uncached_tokens = ahead_tokens + own_tokens
        if uncached_tokens <= 0 or ttft_s <= 0:
            return
        self._samples.append((float(uncached_tokens), ttft_s))
        if ahead_tokens <= 0:
            (self._alone_busy if busy else self._alone).append((float(own_tokens), ttft_s))
        if len(self._samples) >= _MIN_SAMPLES:
            self._refit()

    def _refit(self) -> None:
        count = len(self._samples)
        mean_x = sum(x for x, _ in self._samples) / count
        mean_y = sum(y for _, y in self._samples) / count
        if len(self._drains) >= _MIN_SAMPLES:
            self.rate = sum(tokens for tokens, _ in self._drains) / sum(seconds for _, seconds in self._drains)
            self.overhead_s = self.busy_overhead_s = max(0.0, self._unexplained(self._samples))
            self._refit_overheads()
            return
        var_x = sum((x - mean_x) ** 2 for x, _ in self._samples) / count
        if var_x >= _MIN_SPREAD_TOKENS**2:
            cov = sum((x - mean_x) * (y - mean_y) for x, y in self._samples) / count
            seconds_per_token = cov / var_x
            if seconds_per_token > 0:
                self.rate = 1.0 / seconds_per_token
        # The intercept of a line with that slope through the samples' mean. Below zero the rate is too slow
        # for what was seen (the prior, typically): the plain ratio then predicts requests like these exactly.
        overhead = mean_y - mean_x / self.rate
        if overhead < 0:
            self.rate = mean_x / mean_y
            overhead = 0.0
        self.overhead_s = self.busy_overhead_s = overhead
        self._refit_overheads()

    def _refit_overheads(self) -> None:
        """Measured on requests that found nothing ahead, whose x is exact: apart for a replica that was
        decoding others (a new request waits for the pass in progress, and with an overlap scheduler for the
        one formed during it) and an idle one. Either, until it has samples of its own, takes the other's."""
        idle = self._unexplained(self._alone) if len(self._alone) >= _MIN_ALONE else None
        busy = self._unexplained(self._alone_busy) if len(self._alone_busy) >= _MIN_ALONE else None
        if idle is None:
            idle = busy
        if busy is None:
            busy = idle
        if idle is not None and busy is not None:
            self.overhead_s = max(0.0, idle)
            self.busy_overhead_s = max(0.0, busy)

    def _unexplained(self, samples: deque[tuple[float, float]]) -> float:
        """The median TTFT that the rate leaves unexplained: the median, as a request that waited on other
        clients' work there (which the gateway cannot count ahead of it) must not set the overhead of all."""
        return statistics.median(y - x / self.rate for x, y in samples)
