"""A policy from outside the package, loaded with ``spillgate serve --plugin``, serves real requests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import openai
import yaml

from tests.support.gateway import TENANT_KEY, gateway_config, start_replica
from tests.support.procs import free_port, start_spillgate

TOY_POLICY = "tests.examples.toy_policy"


def test_a_plugin_policy_routes_requests_it_was_loaded_for(tmp_path: Path) -> None:
    replica = start_replica(tmp_path)
    port = free_port()
    config = gateway_config([replica.url], state={"data_dir": str(tmp_path / "data")})
    config["routes"][0]["policy"] = "most_free_kv"
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    gateway = start_spillgate(
        ["serve", "--config", str(path), "--port", str(port), "--plugin", TOY_POLICY], port=port, log_dir=tmp_path
    )
    try:
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY)
        raw = client.chat.completions.with_raw_response.create(
            model="chat", messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert raw.headers["x-spillgate-reason"] == "most_free_kv"
        assert raw.parse().choices[0].message.content
    finally:
        gateway.stop()
        replica.stop()


def test_without_the_plugin_the_config_naming_it_is_refused(tmp_path: Path) -> None:
    config = gateway_config(["http://127.0.0.1:1"])
    config["routes"][0]["policy"] = "most_free_kv"
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    serve = [sys.executable, "-m", "spillgate.gateway.cli", "serve", "--config", str(path)]
    result = subprocess.run(serve, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "routes.0.policy: Input should be" in result.stderr
    missing = subprocess.run([*serve, "--plugin", "no_such_plugin_module"], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2
    assert "plug-in module no_such_plugin_module failed to load" in missing.stderr
