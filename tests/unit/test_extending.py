"""A new policy or engine is one module that registers itself: the toy ones in ``tests/examples`` are taken
through the real config parser, routes, decisions and replica probes, as a user's would be."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from spillgate.backends.engines import ReplicaLoad, engine_named
from spillgate.backends.registry import Backend, BackendRegistry
from spillgate.gateway.control.config import ConfigError, parse_config
from spillgate.gateway.control.routes import build_routes
from spillgate.policies.spill import HybridPolicy
from spillgate.policies.types import BackendState, NoCandidate, RouteRequest, Snapshot
from tests.examples import toy_engine, toy_policy

ROOT = Path(__file__).resolve().parents[2]
POOL = {"name": "p", "served_model": "m", "replicas": ["http://127.0.0.1:1"]}


def config(route: dict, pool: dict = POOL, **rest: object) -> dict:
    return {"pools": [pool], "routes": [{"name": "r", "targets": ["p"], **route}], "auth": {"required": False}, **rest}


def request(sequence: int = 0) -> RouteRequest:
    return RouteRequest(tenant="t", route="r", prompt_tokens=100, max_tokens=10, stream=False, sequence=sequence)


def replicas(*usage: float, healthy: tuple[bool, ...] = ()) -> Snapshot:
    flags = healthy or (True,) * len(usage)
    return Snapshot(tuple(BackendState(f"p-{i}", "replica", flags[i], token_usage=u) for i, u in enumerate(usage)))


def test_a_route_names_the_toy_policy_and_it_decides() -> None:
    parsed = parse_config(config({"policy": "most_free_kv"}))
    policy = build_routes(parsed, {"p": ["p-0", "p-1", "p-2"]}, {})["r"].policy
    decision = policy.decide(request(), replicas(0.9, 0.2, 0.5))
    assert (decision.backend, decision.reason, decision.ranked) == ("p-1", "most_free_kv", ("p-1", "p-2", "p-0"))
    assert policy.decide(request(), replicas(0.9, 0.2, healthy=(True, False))).backend == "p-0"
    assert {policy.decide(request(n), replicas(0.5, 0.5)).backend for n in range(2)} == {"p-0", "p-1"}
    assert not policy.uses_prefix
    with pytest.raises(NoCandidate):
        policy.decide(request(), replicas(0.1, healthy=(False,)))


def test_the_toy_policy_takes_weights_but_no_settings() -> None:
    parse_config(config({"policy": "most_free_kv", "weights": {"free_kv": 2.0}}))
    with pytest.raises(ConfigError) as info:
        parse_config(config({"policy": "most_free_kv", "affinity": {"max_slowdown": 3}}))
    assert info.value.problems == [("routes.0.affinity", "most_free_kv takes no 'affinity' setting")]
    with pytest.raises(ConfigError) as info:
        parse_config(config({"policy": "most_free_kv", "weights": {"prefix_hit": 1.0}}))
    assert info.value.problems[0][0] == "routes.0.weights"


def test_the_toy_policy_ranks_the_replicas_of_a_hybrid_route() -> None:
    hosted = {"name": "frontier", "model": "openai/gpt-4o", "api_key": "sk-not-used"}
    parsed = parse_config(config({"policy": "most_free_kv", "targets": ["p", "frontier"]}, hosted_models=[hosted]))
    policy = build_routes(parsed, {"p": ["p-0", "p-1"], "frontier": ["frontier"]}, {})["r"].policy
    assert isinstance(policy, HybridPolicy) and policy.replicas.name == "most_free_kv"  # type: ignore[attr-defined]
    assert policy.decide(request(), replicas(0.7, 0.1)).backend == "p-1"


def test_unknown_names_are_refused_listing_the_registered_ones() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(config({"policy": "magic"}, {**POOL, "engine": "tgi"}))
    problems = dict(info.value.problems)
    built_in = "Input should be 'round_robin', 'least_load', 'power_of_two', 'consistent_hash', 'cache_aware'"
    assert problems["routes.0.policy"].startswith(built_in), "as the Literal of names said it, plug-ins after"
    assert problems["routes.0.policy"].endswith(" or 'most_free_kv'")
    assert "'toyserve'" in problems["pools.0.engine"] and "'sglang'" in problems["pools.0.engine"]


def test_a_pool_names_the_toy_engine() -> None:
    parsed = parse_config(config({}, {**POOL, "engine": "toyserve"}))
    engine = engine_named(parsed.pools[0].engine)
    assert isinstance(engine, toy_engine.ToyServe)
    load = engine.parse_load("running 3\nwaiting 2\nkv_used 0.25\nprompt_tokens 1200\n\n")
    assert load == ReplicaLoad(running=3, queued=2, token_usage=0.25, prompt_tokens_total=1200.0)
    assert engine.parse_load("") == ReplicaLoad()


class ToyServer(BaseHTTPRequestHandler):
    """The made-up server's three endpoints, answering as a toyserve replica would."""

    pages = {
        "/alive": ("text/plain", "ok"),
        "/stats": ("text/plain", "running 3\nwaiting 2\nkv_used 0.25\n"),
        "/limits": ("application/json", json.dumps({"kv_tokens": 50000, "context": 8192})),
    }

    def do_GET(self) -> None:
        kind, body = self.pages.get(self.path, ("text/plain", ""))
        self.send_response(200 if self.path in self.pages else 404)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def toyserve() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ToyServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def test_the_registry_probes_a_replica_through_the_toy_engine(toyserve: str) -> None:
    backend = Backend("p-0", "replica", toyserve, "m", engine=engine_named("toyserve"))
    registry = BackendRegistry([backend], interval_s=60.0, timeout_s=2.0, unhealthy_after=1)
    await registry.start()
    try:
        assert backend.healthy and backend.last_error == ""
        assert (backend.load.running, backend.load.queued, backend.load.token_usage) == (3, 2, 0.25)
        assert backend.info is not None and backend.info.metrics
        assert (backend.max_total_tokens, backend.context_window) == (50000, 8192)
        state = registry.snapshot(["p-0"]).backends[0]
        assert (state.running, state.queued, state.external_load, state.token_usage) == (3, 2, 5, 0.25)
        assert toy_policy.most_free_kv({}).decide(request(), registry.snapshot(["p-0"])).backend == "p-0"
    finally:
        await registry.stop()


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize("module", [toy_policy, toy_engine], ids=["policy", "engine"])
def test_the_architecture_doc_quotes_each_toy_file(module: object) -> None:
    code = Path(module.__file__).read_text().strip()  # type: ignore[attr-defined]
    blocks = python_blocks((ROOT / "docs" / "architecture.md").read_text())
    assert any(code in block for block in blocks), f"docs/architecture.md quotes no ```python block of {code[:60]!r}"
