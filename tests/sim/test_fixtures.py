"""The simulator held to what real SGLang and vLLM answered (``tests/fixtures``, captured by ``make capture-fixtures``).

Each fixture's request is sent again to a simulator started with the same flags, and the answer must have the
same status and shape: the same field names, the same types, null where the real server says null, absent
where it leaves a field out. Values (ids, timestamps, the random model's words) are not compared.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.sim.conftest import StartReplica
from tests.support.procs import RunningProcess, free_port
from tests.support.shapes import differences, metric_families

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CONTEXT = 16384
ENGINES = ("sglang", "vllm")
PROFILES = ("defaults", "recommended")

SERVER_INFO_READ = (
    "max_total_num_tokens",
    "max_running_requests",
    "chunked_prefill_size",
    "disable_overlap_schedule",
    "enable_cache_report",
    "enable_metrics",
    "page_size",
    "version",
    "internal_states",
)
"""What the gateway reads from ``/server_info`` (``backends/engines/sglang.py``)."""
METRICS_READ = {
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate"),
    "vllm": (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:cache_config_info",
    ),
}
"""What the gateway reads from each engine's ``/metrics`` (``backends/engines/``)."""


def fixtures(engine: str, profile: str) -> list[Path]:
    return sorted((FIXTURES / engine / profile).glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def sims(start_sim: StartReplica) -> dict[tuple[str, str], RunningProcess]:
    """One simulator per captured engine and profile, with the flags the real server had (its KV-event publisher
    moved to a free port)."""
    started = {}
    for engine in ENGINES:
        for profile in PROFILES:
            flags = load(FIXTURES / engine / profile / "health.json")["flags"]
            flags = [_on_a_free_port(f) if flags[i - 1] == "--kv-events-config" else f for i, f in enumerate(flags)]
            # The real servers were started with a 64k-token KV pool (tests/engines/servers.py) on the tiny model's
            # 16k context; the simulator is told the context, which then shows as set (context_length below).
            base = ["--bare", "--time-scale", "0.02", "--model-name", "tiny", "--context-length", str(CONTEXT)]
            base += ["--max-total-tokens", "65536", "--engine", engine]
            started[engine, profile] = start_sim("sim-replica", *base, *flags)
    return started


def _on_a_free_port(kv_events_config: str) -> str:
    config = json.loads(kv_events_config)
    config["endpoint"] = config["endpoint"].rsplit(":", 1)[0] + f":{free_port()}"
    return json.dumps(config)


def replay(sim: RunningProcess, record: dict[str, Any]) -> httpx.Response:
    request = record["request"]
    headers = {}
    if request["with_api_key"]:
        flags = record["flags"]
        headers["authorization"] = f"Bearer {flags[flags.index('--api-key') + 1]}"
    if request["method"] == "GET":
        return httpx.get(sim.url + request["path"], headers=headers, timeout=60)
    return httpx.post(sim.url + request["path"], json=request["body"], headers=headers, timeout=60)


def body_of(response: httpx.Response) -> Any:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return [
            json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]"
            for line in response.text.splitlines()
            if line.startswith("data: ")
        ]
    if not response.content:
        return None
    try:
        return response.json()
    except json.JSONDecodeError:
        return response.text


def exchange_cases() -> list[Any]:
    cases = []
    for engine in ENGINES:
        for profile in PROFILES:
            for path in fixtures(engine, profile):
                if path.stem.startswith(("metrics", "server_info", "get_server_info", "kv_events", "model_info")):
                    continue  # compared by the tests below, not field by field
                if path.stem.startswith("feature_"):
                    continue  # captured with other flags: test_client_features_fixtures.py
                cases.append(pytest.param(engine, profile, path, id=f"{engine}/{profile}/{path.stem}"))
    return cases


@pytest.mark.parametrize(("engine", "profile", "path"), exchange_cases())
def test_the_simulator_answers_as_the_engine_did(
    sims: dict[tuple[str, str], RunningProcess], engine: str, profile: str, path: Path
) -> None:
    record = load(path)
    response = replay(sims[engine, profile], record)
    assert response.status_code == record["status"], response.text[:500]
    assert response.headers.get("content-type", "").split(";")[0] == record["content_type"].split(";")[0]
    real = record.get("events", record.get("body", record.get("text")))
    sim = body_of(response)
    if isinstance(real, list) and isinstance(sim, list):
        # A stream: the role chunk, a content chunk, the finish chunk, the usage chunk (if any), [DONE].
        assert len(sim) >= 3 and sim[-1] == real[-1] == "[DONE]"
        picks = [0, 1, -2] if not real[-2].get("usage") else [0, 1, -3, -2]
        found = [line for i in picks for line in differences(real[i], sim[i], f"$[{i}]")]
    else:
        found = differences(real, sim)
    assert not found, "\n".join(found)
    if path.stem == "error_bad_temperature":
        assert sim == real


@pytest.mark.parametrize("profile", PROFILES)
def test_server_info_has_what_the_gateway_reads_with_sglangs_types(
    sims: dict[tuple[str, str], RunningProcess], profile: str
) -> None:
    record = load(FIXTURES / "sglang" / profile / "server_info.json")
    real = record["body"]
    sim = replay(sims["sglang", profile], record).json()
    for key in SERVER_INFO_READ:
        assert key in real and key in sim, key
        assert sim[key] is None if real[key] is None else sim[key] is not None, key
    extra = [key for key in sim if key not in real and key != "simulator"]
    assert not extra, f"fields SGLang does not have: {extra}"
    unlike = ("context_length",)  # set for the simulator only
    found = [
        line
        for key in sim
        if key in real and key not in unlike
        for line in differences(real[key], sim[key], f"$.{key}")
        if not line.startswith(tuple(f"$.internal_states[0].{name}" for name in unlike))
    ]
    # internal_states repeat the server args: the simulator's (a subset) must have SGLang's shapes, no more.
    found = [line for line in found if not line.startswith("$.internal_states[0].") or "missing" not in line]
    assert not found, "\n".join(found)
    state_real, state_sim = real["internal_states"][0], sim["internal_states"][0]
    assert state_sim["effective_max_running_requests_per_dp"] > 0
    assert set(state_real["memory_usage"]) == set(state_sim["memory_usage"])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ["metrics_idle", "metrics_busy"])
def test_metrics_have_the_engines_names_types_and_labels(
    sims: dict[tuple[str, str], RunningProcess], engine: str, name: str
) -> None:
    for profile in PROFILES:
        record = load(FIXTURES / engine / profile / f"{name}.json")
        response = replay(sims[engine, profile], record)
        assert response.status_code == record["status"]
        if record["status"] != 200:
            assert response.json() == record["body"]  # {"detail": "Not Found"} without --enable-metrics
            continue
        real = metric_families(record["text"], f"{engine}:")
        sim = metric_families(response.text, f"{engine}:")
        for family in METRICS_READ[engine]:
            assert family in real and family in sim, family
        # SGLang's multiprocess collector shows a family once something was observed: compare those both show.
        mismatched = [f"{f}: real {real[f]}, simulator {sim[f]}" for f in sim if f in real and sim[f] != real[f]]
        assert not mismatched, "\n".join(mismatched)
