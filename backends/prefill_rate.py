"""Learning how fast a replica prefills from the TTFTs the gateway itself observes.

A request that found the replica idle has ``TTFT = overhead + uncached_tokens / rate``. A least-squares line
through the recent such samples gives the rate (its slope's inverse) without the fixed overhead biasing it,
which a plain tokens/TTFT ratio would. While the recent samples are all about the same length the slope
cannot be told from the overhead, so the ratio is used: it predicts exactly the TTFT of prompts like those
(overhead included) and errs on the slow side for longer ones. Until enough samples exist, the configured
prior is used.
"""

from __future__ import annotations

from collections import deque

_WINDOW = 64
_MIN_SAMPLES = 8
_MIN_SPREAD_TOKENS = 256.0


class PrefillRateEstimator:
    __slots__ = ("_samples", "prior", "rate")

    def __init__(self, prior_tokens_per_s: float) -> None:
        self.prior = prior_tokens_per_s
        self.rate = prior_tokens_per_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=_WINDOW)

    def observe(self, uncached_tokens: int, ttft_s: float) -> None:
        """One request that was alone in prefill on this replica: its uncached tokens and its TTFT."""
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
        if var_x < _MIN_SPREAD_TOKENS**2:
            self.rate = mean_x / mean_y  # same-length prompts: the slope is not identifiable, the ratio is
            return
        cov = sum((x - mean_x) * (y - mean_y) for x, y in self._samples) / count
        seconds_per_token = cov / var_x
        if seconds_per_token > 0:
            self.rate = 1.0 / seconds_per_token
