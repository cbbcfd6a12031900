"""One real gateway for the dashboard tests: a simulated replica pool and a simulated hosted model behind a
spilling route, three tenants and an admin key, with traffic already sent through the ``openai`` client."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.support.gateway import OTHER_KEY, TENANT_KEY, gateway_config, replica_name, start_gateway, start_replica
from tests.support.procs import RunningProcess, free_port, start_spillgate

ADMIN_KEY = "sk-test-admin"
RESIDENT_KEY = "sk-test-resident"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"

COMPLEX = (
    "Prove rigorously, step by step, that for every integer n >= 1 the sum of the first n odd numbers is n^2, "
    "then derive a closed form for the sum of squares and compare and contrast induction with a telescoping "
    "argument. Show every step of the derivation and justify each lemma."
)


@dataclass
class Stack:
    gateway: RunningProcess
    reasons: dict[str, int]
    """What the ``x-spillgate-reason`` headers of the traffic said, counted."""
    replicas: list[str]
    """The names of pool ``pool``'s two replicas."""

    @property
    def url(self) -> str:
        return self.gateway.url

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=5).text


def _config(replica_urls: list[str], hosted_url: str) -> dict[str, object]:
    config = gateway_config(replica_urls)
    config["pools"][0] |= {"gpu_usd_per_hour": 3.0, "output_tokens_per_s": 1000}
    config["hosted_models"] = [
        {
            "name": "frontier",
            "model": "openai/frontier-large",
            "api_base": hosted_url + "/v1",
            "api_key": "sk-provider",
            "ttft_ms": 20,
            "tpot_ms": 1,
            "input_per_mtok": 3,
            "output_per_mtok": 15,
            "tier": 2,
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
    config["tenants"][1]["routes"] = ["chat-rr", "hybrid"]
    config["tenants"].append({"name": "resident", "keys": [RESIDENT_KEY], "residency": "self_hosted_only"})
    config["admin"] = {"keys": [ADMIN_KEY]}
    return config


def _traffic(url: str) -> dict[str, int]:
    """Requests that stay on the replicas, spill for complexity, and are kept home by residency."""
    reasons: dict[str, int] = {}
    plan = [
        (TENANT_KEY, "Say hello to my friend.", False),
        (TENANT_KEY, "Write a short poem about the sea.", True),
        (TENANT_KEY, COMPLEX, False),
        (TENANT_KEY, COMPLEX + " Twice.", True),
        (OTHER_KEY, "Name three colours.", True),
        (OTHER_KEY, COMPLEX, True),
        (RESIDENT_KEY, COMPLEX, False),
        (RESIDENT_KEY, "Count to five.", True),
    ]
    clients = {key: OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30) for key, _, _ in plan}
    for key, content, stream in plan:
        client = clients[key]
        messages = [{"role": "user", "content": content}]
        if stream:
            raw = client.chat.completions.with_raw_response.create(
                model="hybrid", messages=messages, max_tokens=12, stream=True, stream_options={"include_usage": True}
            )
            assert sum(1 for _ in raw.parse()) > 1
        else:
            raw = client.chat.completions.with_raw_response.create(model="hybrid", messages=messages, max_tokens=12)
            assert raw.parse().choices
        reason = raw.headers["x-spillgate-reason"]
        reasons[reason] = reasons.get(reason, 0) + 1
    for client in clients.values():
        client.close()
    # One refusal, so that the refusal series the dashboards chart exist.
    refused = httpx.post(url + "/v1/chat/completions", headers={"authorization": "Bearer sk-wrong"}, json={})
    assert refused.status_code == 401
    return reasons


def _wait_healthy(url: str, timeout: float = 20.0) -> None:
    """Until the gateway's probes have found every backend healthy: they started alongside it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        backends = httpx.get(url + "/health", timeout=2).json()["backends"]
        if all(b["healthy"] for b in backends.values()):
            return
        time.sleep(0.05)
    raise TimeoutError(f"backends not healthy after {timeout}s: {backends}")


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir = tmp_path_factory.mktemp("dashboard")
    replica_ports = [free_port(), free_port()]
    hosted_port = free_port()
    hosted_args = ["sim-hosted", "--port", str(hosted_port), "--ttft-ms", "20", "--tpot-ms", "1", "--time-scale", "1"]
    replica_urls = [f"http://127.0.0.1:{p}" for p in replica_ports]
    config = _config(replica_urls, f"http://127.0.0.1:{hosted_port}")
    # Everything starts at once (the gateway's start-up, loading litellm, is the long pole).
    with ThreadPoolExecutor(4) as pool:
        starting = [pool.submit(start_replica, log_dir, "--time-scale", "0.05", port=p) for p in replica_ports]
        starting.append(pool.submit(start_spillgate, hosted_args, port=hosted_port, log_dir=log_dir))
        starting.append(pool.submit(start_gateway, config, log_dir))
        wait(starting)
    started = [f.result() for f in starting if f.exception() is None]
    try:
        for future in starting:
            future.result()  # the first start-up failure, if any
        gateway = started[-1]
        _wait_healthy(gateway.url)
        yield Stack(gateway, _traffic(gateway.url), [replica_name(url) for url in replica_urls])
    finally:
        with ThreadPoolExecutor(4) as pool:
            wait([pool.submit(proc.stop) for proc in started])
