"""One request of each kind before a target is measured: a fast wrong answer must not pass for a fast relay."""

from __future__ import annotations

import orjson

from tests.bench.services import http_request
from tests.bench.stub_backend import STREAM_EVENTS
from tests.bench.workload import Workload


class SmokeFailed(RuntimeError):
    """The target answered, but not what the stub sent."""


def check_target(workload: Workload) -> None:
    """A completion with its usage, and a stream of exactly the stub's events and ``[DONE]``, nothing more."""
    status, body = http_request(workload.url, body=workload.body(False), headers=workload.headers())
    if status != 200:
        raise SmokeFailed(f"non-streaming request answered {status}: {body[:300]!r}")
    completion = orjson.loads(body)
    if not completion.get("choices") or "usage" not in completion:
        raise SmokeFailed(f"non-streaming answer lacks choices or usage: {body[:300]!r}")
    status, body = http_request(workload.url, body=workload.body(True), headers=workload.headers())
    if status != 200:
        raise SmokeFailed(f"streaming request answered {status}: {body[:300]!r}")
    events = [e for e in body.split(b"\n\n") if e.strip()]
    if len(events) != STREAM_EVENTS + 1 or events[-1] != b"data: [DONE]":
        raise SmokeFailed(f"expected {STREAM_EVENTS} events and [DONE], got {len(events)}: {body[-300:]!r}")
    if any(b'"usage"' in e for e in events):
        raise SmokeFailed("the stream carries a usage chunk the client did not ask for")


def check_upstream_request(stub_port: int, served_model: str) -> None:
    """What the last relayed stream looked like upstream: ``model`` rewritten, the usage asked for."""
    status, body = http_request(f"http://127.0.0.1:{stub_port}/bench/last_request")
    sent = orjson.loads(body) if status == 200 else {}
    if sent.get("model") != served_model:
        raise SmokeFailed(f"upstream saw model {sent.get('model')!r}, expected {served_model!r}")
    if (sent.get("stream_options") or {}).get("include_usage") is not True:
        raise SmokeFailed("upstream stream request lacks stream_options.include_usage")
