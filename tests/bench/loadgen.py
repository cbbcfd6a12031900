"""Latency and time-to-first-byte client: N keep-alive connections, closed loop or paced at a total rate.

wrk measures throughput; this measures the distribution, which wrk reports only for whole responses.
It records, per request, the time from writing the request to the first body byte (TTFB) and to the end
of the response. uvloop + httptools keep its own cost per request in the tens of microseconds, so the
percentiles are the server's, not the client's.

    python -m tests.bench.loadgen --port 8080 --model chat --api-key KEY --connections 32 --rate 1500 --stream
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass, field

import httptools
import uvloop

from tests.bench.workload import Workload

_DONE = b"data: [DONE]\n\n"
_REQUEST_TIMEOUT_S = 10.0
_LATE_S = 0.001


@dataclass
class LoadSpec:
    workload: Workload
    connections: int = 1
    seconds: float = 5.0
    warmup: float = 1.0
    rate: float = 0.0
    """Requests (or streams) per second over all connections; 0 sends the next request as soon as one ends."""
    stream: bool = False


@dataclass
class LoadResult:
    connections: int
    stream: bool
    rate: float
    seconds: float
    requests: int
    per_second: float
    p50_ms: float
    p99_ms: float
    ttfb_p50_ms: float
    ttfb_p99_ms: float
    errors: int
    late: int
    """Paced requests sent more than 1 ms after their slot: the target did not keep up with the rate."""


@dataclass
class _Samples:
    total: list[float] = field(default_factory=list)
    ttfb: list[float] = field(default_factory=list)
    errors: int = 0
    late: int = 0


class _Client(asyncio.Protocol):
    """One connection doing one exchange at a time."""

    def __init__(self, stream: bool) -> None:
        self._stream = stream
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._done: asyncio.Future[tuple[float, float]] | None = None
        self._sent = 0.0
        self._first = 0.0
        self._tail = b""
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._finish(ConnectionError("connection closed mid-response"))

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._finish(exc)

    def on_body(self, body: bytes) -> None:
        if not self._first:
            self._first = time.perf_counter()
        if self._stream:
            self._tail = (self._tail + body)[-len(_DONE) :]

    def on_message_complete(self) -> None:
        end = time.perf_counter()
        if self._parser.get_status_code() != 200:
            self._finish(RuntimeError(f"status {self._parser.get_status_code()}"))
        elif self._stream and self._tail != _DONE:
            self._finish(RuntimeError("stream did not end with [DONE]"))
        elif not self._first:
            self._finish(RuntimeError("empty body"))
        elif self._done is not None and not self._done.done():
            self._done.set_result((end - self._sent, self._first - self._sent))

    def _finish(self, error: BaseException) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(error)

    async def exchange(self, request: bytes) -> tuple[float, float]:
        """Send ``request``; return (total, ttfb) in seconds."""
        assert self._transport is not None
        self._done = self._loop.create_future()
        self._first = 0.0
        self._tail = b""
        self._sent = time.perf_counter()
        self._transport.write(request)
        return await asyncio.wait_for(self._done, _REQUEST_TIMEOUT_S)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


async def _connect(workload: Workload, stream: bool) -> _Client:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(lambda: _Client(stream), workload.host, workload.port)
    return client


async def _worker(spec: LoadSpec, index: int, record_from: float, stop_at: float, samples: _Samples) -> None:
    request = spec.workload.raw_request(spec.stream)
    client: _Client | None = None
    period = spec.connections / spec.rate if spec.rate else 0.0
    slot = time.perf_counter() + (index / spec.rate if spec.rate else 0.0)
    try:
        while True:
            now = time.perf_counter()
            if now >= stop_at:
                return
            if period:
                if slot > now:
                    await asyncio.sleep(slot - now)
                elif now - slot > _LATE_S and now >= record_from:
                    samples.late += 1
                slot += period
            if client is None or client.closed:
                try:
                    client = await _connect(spec.workload, spec.stream)
                except OSError:
                    samples.errors += 1
                    await asyncio.sleep(0.05)
                    continue
            sent = time.perf_counter()
            try:
                total, ttfb = await client.exchange(request)
            except (OSError, RuntimeError, httptools.HttpParserError, TimeoutError):
                samples.errors += 1
                client.close()
                client.closed = True
                continue
            if sent >= record_from:
                samples.total.append(total)
                samples.ttfb.append(ttfb)
    finally:
        if client is not None:
            client.close()


def percentile_ms(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile in milliseconds; NaN when there are no samples."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q * len(sorted_values)))
    return round(sorted_values[rank - 1] * 1e3, 3)


async def run_load(spec: LoadSpec) -> LoadResult:
    samples = _Samples()
    start = time.perf_counter()
    record_from = start + spec.warmup
    stop_at = record_from + spec.seconds
    await asyncio.gather(*(_worker(spec, i, record_from, stop_at, samples) for i in range(spec.connections)))
    total, ttfb = sorted(samples.total), sorted(samples.ttfb)
    return LoadResult(
        connections=spec.connections,
        stream=spec.stream,
        rate=spec.rate,
        seconds=spec.seconds,
        requests=len(total),
        per_second=round(len(total) / spec.seconds, 1),
        p50_ms=percentile_ms(total, 0.50),
        p99_ms=percentile_ms(total, 0.99),
        ttfb_p50_ms=percentile_ms(ttfb, 0.50),
        ttfb_p99_ms=percentile_ms(ttfb, 0.99),
        errors=samples.errors,
        late=samples.late,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="bench-model")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds, after the warm-up")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of load whose samples are dropped")
    parser.add_argument("--rate", type=float, default=0.0, help="total requests/s to pace at (0: closed loop)")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a summary line")
    args = parser.parse_args(argv)
    spec = LoadSpec(
        workload=Workload(port=args.port, model=args.model, api_key=args.api_key, host=args.host),
        connections=args.connections,
        seconds=args.seconds,
        warmup=args.warmup,
        rate=args.rate,
        stream=args.stream,
    )
    result = uvloop.run(run_load(spec))
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        print(
            f"{result.requests} {'streams' if spec.stream else 'requests'} ({result.per_second}/s) at "
            f"{spec.connections} conns: total p50 {result.p50_ms} ms p99 {result.p99_ms} ms, "
            f"TTFB p50 {result.ttfb_p50_ms} ms p99 {result.ttfb_p99_ms} ms, errors {result.errors}, late {result.late}"
        )


if __name__ == "__main__":
    main()
