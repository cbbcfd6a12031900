"""A stolen admin key cannot move a secret: a redacted key is restored only onto the destination it was given
for, ``os.environ/`` names are limited to those allowed at start, and upstream hosts to ``secrets.upstream_hosts``."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.gateway.test_live_config import ADMIN_KEY, current, put, serve
from tests.support.gateway import TENANT_KEY, start_replica
from tests.support.procs import RunningProcess, free_port

PROVIDER_KEY = "sk-provider-secret-123"
REPLICA_KEY = "sk-replica-secret-456"


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    proc = start_replica(tmp_path_factory.mktemp("egress-replica"), "--time-scale", "0.05", "--api-key", REPLICA_KEY)
    yield proc
    proc.stop()


def config(replica: RunningProcess, data_dir: Path, **extra: Any) -> dict[str, Any]:
    return {
        "pools": [{"name": "pool", "served_model": "sim-model", "replicas": [replica.url], "api_key": REPLICA_KEY}],
        "hosted_models": [
            {
                "name": "frontier",
                "model": "openai/gpt-4o",
                "api_base": "https://api.openai.com/v1",
                "api_key": PROVIDER_KEY,
            }
        ],
        "routes": [{"name": "chat", "targets": ["pool"]}, {"name": "big", "targets": ["frontier"]}],
        "tenants": [{"name": "tenant-a", "keys": [TENANT_KEY]}],
        "admin": {"keys": [ADMIN_KEY]},
        "state": {"data_dir": str(data_dir)},
        **extra,
    }


@pytest.fixture
def gateway(replica: RunningProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningProcess]:
    monkeypatch.setenv("SPILLGATE_TEST_TOKEN", "allowed-value")
    raw = config(replica, tmp_path / "data")
    raw["tenants"].append({"name": "tenant-env", "keys": ["os.environ/SPILLGATE_TEST_TOKEN"]})
    path = tmp_path / "spillgate.yaml"
    path.write_text(yaml.safe_dump(raw))
    proc = serve(path, tmp_path)
    yield proc
    proc.stop()


def problems(response: httpx.Response) -> dict[str, str]:
    assert response.status_code == 422, response.text
    return {p["path"]: p["message"] for p in response.json()["problems"]}


def test_secrets_are_redacted_and_a_plain_round_trip_keeps_them(gateway: RunningProcess) -> None:
    shown = current(gateway)["config"]
    text = str(shown)
    assert PROVIDER_KEY not in text and REPLICA_KEY not in text
    assert shown["pools"][0]["api_key"] == shown["hosted_models"][0]["api_key"] == "<redacted>"
    assert put(gateway, shown).status_code == 200
    # The replica still gets its key: a request through the pool works.
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers={"authorization": f"Bearer {TENANT_KEY}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text


def test_a_redacted_key_is_not_restored_onto_a_new_destination(gateway: RunningProcess) -> None:
    shown = current(gateway)["config"]
    moved = copy.deepcopy(shown)
    moved["hosted_models"][0]["api_base"] = "https://api.openai.com/collector/v1"
    assert "send the key again" in problems(put(gateway, moved))["hosted_models.0.api_key"]
    other_model = copy.deepcopy(shown)
    other_model["hosted_models"][0]["model"] = "anthropic/claude-sonnet-4-5"
    assert "hosted_models.0.api_key" in problems(put(gateway, other_model))
    new_replica = copy.deepcopy(shown)
    new_replica["pools"][0]["replicas"].append(f"http://127.0.0.1:{free_port()}")
    assert "send the key again" in problems(put(gateway, new_replica))["pools.0.api_key"]
    # With the key sent again, the admin knows it already: accepted, to a host the config at start uses.
    moved["hosted_models"][0]["api_key"] = "sk-a-key-the-admin-has"
    assert put(gateway, moved).status_code == 200
    moved["hosted_models"][0]["api_base"] = "https://collector.example/v1"
    assert "upstream_hosts" in problems(put(gateway, moved))["hosted_models.0.api_base"]


def test_an_edit_may_name_only_the_environment_variables_named_at_start(gateway: RunningProcess) -> None:
    shown = current(gateway)["config"]
    home = copy.deepcopy(shown)
    home["hosted_models"][0]["api_key"] = "os.environ/HOME"
    assert "secrets.env" in problems(put(gateway, home))["hosted_models.0.api_key"]
    # A variable named at start, but as a tenant key: sent to no upstream.
    named = copy.deepcopy(shown)
    named["hosted_models"][0]["api_key"] = "os.environ/SPILLGATE_TEST_TOKEN"
    assert "no upstream" in problems(put(gateway, named))["hosted_models.0.api_key"]
    widen = copy.deepcopy(shown) | {"secrets": {"env": ["HOME", "SPILLGATE_TEST_TOKEN"]}}
    assert "restart" in problems(put(gateway, widen))["secrets"]


def test_upstream_hosts_bound_pools_and_hosted_models(replica: RunningProcess, tmp_path: Path) -> None:
    raw = config(replica, tmp_path / "data", secrets={"upstream_hosts": ["127.0.0.0/8", "*.openai.com"]})
    path = tmp_path / "spillgate.yaml"
    path.write_text(yaml.safe_dump(raw))
    proc = serve(path, tmp_path)
    try:
        shown = current(proc)["config"]
        outside = copy.deepcopy(shown)
        outside["pools"][0]["replicas"] = ["http://10.1.2.3:30000"]
        outside["pools"][0]["api_key"] = "sk-new"
        assert "upstream_hosts" in problems(put(proc, outside))["pools.0.replicas.0"]
        hosted = copy.deepcopy(shown)
        hosted["hosted_models"][0]["api_base"] = "https://api.openai.com.evil.example/v1"
        hosted["hosted_models"][0]["api_key"] = "sk-new"
        assert "upstream_hosts" in problems(put(proc, hosted))["hosted_models.0.api_base"]
        inside = copy.deepcopy(shown)
        inside["hosted_models"][0]["api_base"] = "https://eu.api.openai.com/v1"
        inside["hosted_models"][0]["api_key"] = "sk-new"
        assert put(proc, inside).status_code == 200
    finally:
        proc.stop()


def test_a_replica_url_with_a_path_query_user_or_bad_port_is_refused(gateway: RunningProcess) -> None:
    shown = current(gateway)["config"]
    unparsable = ("http://[::1", "http://127.0.0.1:abc", "http://127.0.0.1:99999", "http://127.0.0.1:0")
    for url in ("http://127.0.0.1:1/v1?x=", "http://user@127.0.0.1:1", "http://127.0.0.1:1/prefix", *unparsable):
        edit = copy.deepcopy(shown)
        edit["pools"][0]["replicas"] = [url]
        edit["pools"][0]["api_key"] = "sk-new"
        assert "pools.0.replicas.0" in problems(put(gateway, edit))


def test_metrics_with_tenant_labels_need_a_token(replica: RunningProcess, tmp_path: Path) -> None:
    from spillgate.gateway.control.config import ConfigError, parse_config

    raw = config(replica, tmp_path / "data", metrics={"tenant_labels": True})
    with pytest.raises(ConfigError, match="token"):
        parse_config(raw, source="test")
    raw["metrics"]["token"] = "sk-metrics-reader"
    path = tmp_path / "spillgate.yaml"
    path.write_text(yaml.safe_dump(raw))
    proc = serve(path, tmp_path)
    try:
        assert httpx.get(proc.url + "/metrics").status_code == 401
        assert httpx.get(proc.url + "/metrics", headers={"authorization": f"Bearer {TENANT_KEY}"}).status_code == 401
        scraped = httpx.get(proc.url + "/metrics", headers={"authorization": "Bearer sk-metrics-reader"})
        assert scraped.status_code == 200 and "spillgate_" in scraped.text
        assert "sk-metrics-reader" not in str(current(proc)["config"])
    finally:
        proc.stop()
