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
"""

from __future__ import annotations

from collections import deque

_WINDOW = 64
_MIN_SAMPLES = 8
_MIN_SPREAD_TOKENS = 256.0


class PrefillRateEstimator:
    __slots__ = ("_samples", "overhead_s", "prior", "rate")

    def __init__(self, prior_tokens_per_s: float) -> None:
        self.prior = prior_tokens_per_s
        self.rate = prior_tokens_per_s
        self.overhead_s = 0.0
        self._samples: deque[tuple[float, float]] = deque(maxlen=_WINDOW)

    def observe(self, uncached_tokens: int, ttft_s: float) -> None:
        """One request: the uncached tokens prefilled up to its first token (those ahead of it and its own), and
        its TTFT."""
        if uncached_tokens <= 0 or ttft_s <= 0:
            return
        self._samples.append((float(uncached_tokens), ttft_s))
        if len(self._samples) >= _MIN_SAMPLES:
            self._refit()

    def _refit(self) -> None:
        count = len(self._samples)
        mean_x = sum(x for x, _ in self._samples) / count
        mean_y = sum(y for _, y in self._samples) / count
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
        self.overhead_s = overhead
