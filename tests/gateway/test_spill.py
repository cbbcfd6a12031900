"""Spill through the real gateway: complex prompts and overflow go to the hosted model; residency holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.gateway import TENANT_KEY, gateway_config, replica_name, start_gateway, start_replica
from tests.support.procs import RunningProcess, free_port, start_spillgate

RESIDENT_KEY = "sk-test-resident"


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    # One replica that runs one request at a time, at real speed: a second request must wait for the first.
    replica = start_replica(tmp_path_factory.mktemp("replica"), "--time-scale", "1", "--max-running-requests", "1")
    yield replica
    replica.stop()


@pytest.fixture(scope="module")
def hybrid(replica: RunningProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    log_dir: Path = tmp_path_factory.mktemp("hybrid")
    port = free_port()
    hosted = start_spillgate(
        ["sim-hosted", "--port", str(port), "--ttft-ms", "80", "--tpot-ms", "5", "--time-scale", "1"],
        port=port,
        log_dir=log_dir,
    )
    config = gateway_config([replica.url])
    config["hosted_models"] = [
        {
            "name": "frontier",
            "model": "openai/frontier-large",
            "api_base": hosted.url + "/v1",
            "api_key": "sk-provider",
            "ttft_ms": 80,
            "tpot_ms": 5,
            "input_per_mtok": 3,
            "output_per_mtok": 15,
        }
    ]
    config["routes"].append(
        {
            "name": "hybrid",
            "targets": ["pool", "frontier"],
            "policy": "cache_aware",
            "spill": {"complexity_threshold": 0.5},
        }
    )
    config["tenants"][0]["slo"] = {"ttft_ms": 400, "tpot_ms": 50}
    config["tenants"].append(
        {
            "name": "resident",
            "keys": [RESIDENT_KEY],
            "residency": "self_hosted_only",
            "slo": {"ttft_ms": 400, "tpot_ms": 50},
        }
    )
    gateway = start_gateway(config, log_dir)
    yield gateway
    for proc in (gateway, hosted):
        proc.stop()


def chat(gateway: RunningProcess, content: str, *, key: str = TENANT_KEY, max_tokens: int = 4) -> httpx.Response:
    body = {"model": "hybrid", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    response = httpx.post(
        gateway.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=60
    )
    assert response.status_code == 200, response.text
    return response


def route(response: httpx.Response) -> tuple[str, str]:
    return response.headers["x-spillgate-backend"], response.headers["x-spillgate-reason"]


COMPLEX = (
    "Prove rigorously, step by step, that for every integer n >= 1 the sum of the first n odd numbers is n^2, "
    "then derive a closed form for the sum of squares and compare and contrast induction with a telescoping "
    "argument. Show every step of the derivation and justify each lemma."
)


def test_simple_prompts_stay_on_the_replicas(hybrid: RunningProcess, replica: RunningProcess) -> None:
    assert route(chat(hybrid, "Say hello to my friend.")) == (replica_name(replica), "least_ttft")


def test_complex_prompts_go_to_the_frontier_tier(hybrid: RunningProcess, replica: RunningProcess) -> None:
    assert route(chat(hybrid, COMPLEX)) == ("frontier", "complex")
    # A tenant that may never leave our GPUs is served on the replica all the same.
    assert route(chat(hybrid, COMPLEX, key=RESIDENT_KEY)) == (replica_name(replica), "residency")


def test_overflow_spills_and_residency_holds(hybrid: RunningProcess, replica: RunningProcess) -> None:
    # A streamed request teaches the gateway the replica's time per output token.
    warm = {"model": "hybrid", "messages": [{"role": "user", "content": "Warm up."}], "max_tokens": 150, "stream": True}
    with httpx.stream(
        "POST",
        hybrid.url + "/v1/chat/completions",
        json=warm,
        headers={"authorization": f"Bearer {TENANT_KEY}"},
        timeout=60,
    ) as response:
        assert sum(1 for _ in response.iter_lines()) > 100
    body = {
        "model": "hybrid",
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 400,
        "stream": True,
    }
    with httpx.stream(
        "POST",
        hybrid.url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {TENANT_KEY}"},
        timeout=60,
    ) as busy:
        assert busy.headers["x-spillgate-backend"] == replica_name(replica)
        lines = busy.iter_lines()  # keep the iterator: dropping it would close the stream
        next(lines)
        # The replica's only slot is taken for ~2.6 s: a new request is predicted to miss a 400 ms TTFT.
        assert route(chat(hybrid, "Quick question: what is 2 + 2?")) == ("frontier", "overflow")
        resident = chat(hybrid, "Quick question: what is 3 + 3?", key=RESIDENT_KEY)
        assert route(resident) == (replica_name(replica), "residency")
    metrics = httpx.get(hybrid.url + "/metrics").text
    assert 'reason="overflow"' in metrics and 'reason="complex"' in metrics and 'reason="residency"' in metrics
    spend = {
        line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("spillgate_spend_usd_total{")
    }
    hosted_spend = sum(v for k, v in spend.items() if 'kind="hosted"' in k)
    replica_spend = sum(v for k, v in spend.items() if 'kind="replica"' in k)
    assert hosted_spend > 0 and replica_spend == 0  # the test pool has no gpu_usd_per_hour
    equivalent = next(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith('spillgate_hosted_equivalent_usd_total{route="hybrid",tenant="all"}')
    )
    assert equivalent > hosted_spend, "sending everything to the hosted model would have cost more"
