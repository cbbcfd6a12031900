"""A pooled connection to a hosted provider that the provider closed before answering is retried, not a 502."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx

from tests.support.gateway import TENANT_KEY, gateway_config, start_gateway, start_replica
from tests.support.procs import free_port, start_process

AUTH = {"authorization": f"Bearer {TENANT_KEY}"}


def test_a_stale_keep_alive_connection_is_retried_once_on_a_new_one(tmp_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "tests.gateway.stale_keepalive_provider", "--port", str(port)]
    provider = start_process(command, port=port, log_dir=tmp_path, ready_path="/ready", timeout=30, name="provider")
    replica = start_replica(tmp_path, "--time-scale", "0.02")
    config = gateway_config([replica.url])
    config["hosted_models"] = [
        {
            "name": "stale",
            "model": "openai/m",
            "api_base": provider.url + "/v1",
            "api_key": "sk-provider-key-1234",
            "input_per_mtok": 3,
            "output_per_mtok": 15,
            "timeout_s": 5,
        }
    ]
    config["routes"].append({"name": "stale", "targets": ["stale"]})
    gateway = start_gateway(config, tmp_path)
    try:
        body = {"model": "stale", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for _ in range(4):  # every request after the first finds its pooled connection closed under it
            response = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["message"]["content"] == "hi"
            assert response.headers["x-spillgate-backend"] == "stale"
    finally:
        gateway.stop()
        replica.stop()
        provider.stop()
