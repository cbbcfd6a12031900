"""The simulator started as SGLang is by default, and with each of the flags that change what it serves."""

from __future__ import annotations

import time

import httpx

from tests.sim.conftest import StartReplica

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello " * 50}], "max_tokens": 2}


def test_bare_defaults_serve_no_metrics_and_no_cached_tokens(start_sim: StartReplica) -> None:
    bare = start_sim("sim-replica", "--bare", "--time-scale", "0.05", "--model-name", "m")
    metrics = httpx.get(bare.url + "/metrics")
    assert (metrics.status_code, metrics.json()) == (404, {"detail": "Not Found"})
    usage = httpx.post(bare.url + "/v1/chat/completions", json=CHAT, timeout=30).json()["usage"]
    assert usage["prompt_tokens_details"] is None
    with httpx.stream(
        "POST",
        bare.url + "/v1/chat/completions",
        json={**CHAT, "stream": True, "stream_options": {"include_usage": True}},
        timeout=30,
    ) as response:
        last = [line for line in response.iter_lines() if line.startswith("data: {")][-1]
    assert '"prompt_tokens_details":null' in last
    info = httpx.get(bare.url + "/server_info").json()
    assert info["enable_metrics"] is False and info["enable_cache_report"] is False
    assert info["disable_overlap_schedule"] is False and info["max_running_requests"] is None


def test_health_runs_a_generation_and_ready_answers_at_once(start_sim: StartReplica) -> None:
    """SGLang's /health sends a one-token request and looks once a second for an answer (simulated seconds)."""
    replica = start_sim("sim-replica", "--time-scale", "0.2", "--model-name", "m")
    started = time.monotonic()
    assert httpx.get(replica.url + "/health", timeout=10).status_code == 200
    assert time.monotonic() - started >= 0.2
    started = time.monotonic()
    assert httpx.get(replica.url + "/ready", timeout=10).status_code == 200
    assert time.monotonic() - started < 0.2


def test_api_key_guards_all_but_probes_and_metrics(start_sim: StartReplica) -> None:
    replica = start_sim("sim-replica", "--time-scale", "0.05", "--model-name", "m", "--api-key", "sk-sim-key")
    refused = httpx.post(replica.url + "/v1/chat/completions", json=CHAT)
    assert (refused.status_code, refused.json()) == (401, {"error": "Unauthorized"})
    wrong = httpx.get(replica.url + "/server_info", headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401
    for open_path in ("/ready", "/metrics"):
        assert httpx.get(replica.url + open_path).status_code == 200
    good = httpx.post(replica.url + "/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer sk-sim-key"})
    assert good.status_code == 200 and good.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
