"""Where a replica's simulated time went, pass by pass: prefill against decode, and who waited (``/sim/passes``).

No real engine reports these. They split a replica's time per output token into its two causes: the decode
steps themselves (weights plus the batch's KV, read once per step) and the prefill passes that run between
them while the running requests wait (SGLang never mixes the two). For every decode step each running request
gets one token, so ``decode_token_s`` (step time x batch) over ``decode_tokens`` is the part of the inter-token
latency the steps cost, and ``stalled_decoder_s`` (prefill time x requests waiting to decode) over the same
tokens is the part the prefills cost; ``late_decoder_s`` is what a simulator falling behind its time scale
added (zero on a machine that keeps up). Cumulative since the replica started, in simulated seconds; a caller
reads them before and after a run and takes the difference. The last :data:`LOG_SIZE` passes and arrivals are
also kept one by one (``/sim/passes/log``), for a timeline of who waited on whom.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

LOG_SIZE = 65536
"""Records kept: about ten benchmark runs of a few thousand passes on one replica."""


class PassRecord(NamedTuple):
    """One prefill pass, decode step or arrival: ``decoders`` running requests then (a decode step's batch),
    ``requests`` in the pass (for an arrival: queued ahead of it), ``tokens`` computed (a decode step: KV read;
    an arrival: its prompt tokens cached then)."""

    seq: int
    kind: str
    """``prefill``, ``decode`` or ``arrival``."""
    start: float
    duration: float
    decoders: int
    requests: int
    tokens: int


@dataclass
class PassCounters:
    """Cumulative figures of the forward passes one scheduler ran; the scheduler is their only writer."""

    prefill_passes: int = 0
    prefill_s: float = 0.0
    prefill_tokens: int = 0
    """New tokens computed (cached prefix tokens not counted)."""
    prefill_requests: int = 0
    """Requests or chunks in the passes (a chunked prompt counts once per chunk)."""
    prefill_idle_decoders_s: float = 0.0
    """Prefill time during which no running request was waiting to decode."""
    stalled_decoder_s: float = 0.0
    """Sum over prefill passes of duration x running requests waiting for the next decode step."""
    late_s: float = 0.0
    """Simulated time lost while requests waited to decode, because a prefill's request arrived (by the wall
    clock) after the scheduler's own clock: the process fell behind the time scale (an overloaded machine)."""
    late_decoder_s: float = 0.0
    """The same, times the running requests that waited."""
    decode_passes: int = 0
    decode_s: float = 0.0
    decode_tokens: int = 0
    """Tokens the decode steps produced: the sum of their batch sizes."""
    decode_token_s: float = 0.0
    """Sum over decode steps of duration x batch size."""
    decode_context_tokens: int = 0
    """Sum over decode steps of the batch's KV tokens (what each step reads besides the weights)."""
    arrivals: int = 0
    decoders_at_arrival: int = 0
    """Sum over arriving requests of the requests decoding there then: the ones its prefill will keep waiting."""
    waiting_at_arrival: int = 0
    """Sum over arriving requests of the requests queued ahead of it for prefill."""
    cached_at_arrival: int = 0
    """Sum over arriving requests of the prompt tokens the cache held for them when they arrived."""
    cached_at_admission: int = 0
    """The same when they were admitted to a prefill batch (what they were served from): less, by what was
    evicted while they queued, or more, by what a request ahead of them stored."""

    log: deque[PassRecord] = field(default_factory=lambda: deque(maxlen=LOG_SIZE), repr=False)
    _seq: int = field(default=0, repr=False)

    def _record(self, kind: str, start: float, duration: float, decoders: int, requests: int, tokens: int) -> None:
        self._seq += 1
        self.log.append(PassRecord(self._seq, kind, start, duration, decoders, requests, tokens))

    @property
    def last_seq(self) -> int:
        """The number of the latest record (0 before any)."""
        return self._seq

    def records_after(self, seq: int) -> list[PassRecord]:
        """The kept records numbered above ``seq``, oldest first."""
        return [record for record in self.log if record.seq > seq]

    def arrival(self, at: float, decoders: int, waiting: int, cached: int) -> None:
        self._record("arrival", at, 0.0, decoders, waiting, cached)
        self.cached_at_arrival += cached
        self.arrivals += 1
        self.decoders_at_arrival += decoders
        self.waiting_at_arrival += waiting

    def admitted(self, cached: int) -> None:
        self.cached_at_admission += cached

    def late(self, lost: float, waiting_decoders: int) -> None:
        if lost > 0 and waiting_decoders:
            self.late_s += lost
            self.late_decoder_s += lost * waiting_decoders

    def prefill(self, start: float, duration: float, tokens: int, requests: int, waiting_decoders: int) -> None:
        self._record("prefill", start, duration, waiting_decoders, requests, tokens)
        self.prefill_passes += 1
        self.prefill_s += duration
        self.prefill_tokens += tokens
        self.prefill_requests += requests
        self.stalled_decoder_s += duration * waiting_decoders
        if not waiting_decoders:
            self.prefill_idle_decoders_s += duration

    def decode(self, start: float, duration: float, batch: int, context_tokens: int) -> None:
        self._record("decode", start, duration, batch, batch, context_tokens)
        self.decode_passes += 1
        self.decode_s += duration
        self.decode_tokens += batch
        self.decode_token_s += duration * batch
        self.decode_context_tokens += context_tokens

    def to_json(self) -> dict[str, Any]:
        """The cumulative figures (not the log)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("log", "_seq")}
