"""A stolen admin key cannot send a secret anywhere new: each provider and replica key, ``os.environ/NAME`` ones
included (the admin API shows those as written), is bound at start to where it was configured to go.

A listener on this machine stands in for the attacker and records every ``Authorization`` header it is sent.
It listens on the same host as the start-up replica, so only the binding (not the host allow-list) stops it.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.gateway.test_live_config import ADMIN_KEY, current, eventually, put, serve
from tests.support.gateway import TENANT_KEY, start_replica
from tests.support.procs import RunningProcess

PROVIDER_KEY = "sk-provider-from-env-9f3"
REPLICA_KEY = "sk-replica-from-env-4c1"
TENANT_KEY_IN_ENV = "sk-tenant-from-env-7a2"


class Listener:
    """An HTTP server that answers everything with ``{}`` and keeps every Authorization header it saw."""

    def __init__(self) -> None:
        seen: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                seen.append(self.headers.get("authorization") or "")
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.seen = seen
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    proc = start_replica(tmp_path_factory.mktemp("bound-replica"), "--time-scale", "0.05", "--api-key", REPLICA_KEY)
    yield proc
    proc.stop()


def start(replica: RunningProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **extra: Any) -> RunningProcess:
    monkeypatch.setenv("SPILLGATE_PROVIDER_KEY", PROVIDER_KEY)
    monkeypatch.setenv("SPILLGATE_REPLICA_KEY", REPLICA_KEY)
    monkeypatch.setenv("SPILLGATE_TENANT_KEY", TENANT_KEY_IN_ENV)
    raw = {
        "pools": [
            {
                "name": "pool",
                "served_model": "sim-model",
                "replicas": [replica.url],
                "api_key": "os.environ/SPILLGATE_REPLICA_KEY",
            }
        ],
        "hosted_models": [
            {
                "name": "frontier",
                "model": "openai/gpt-4o",
                "api_base": "https://api.openai.com/v1",
                "api_key": "os.environ/SPILLGATE_PROVIDER_KEY",
            }
        ],
        "routes": [{"name": "chat", "targets": ["pool"]}, {"name": "big", "targets": ["frontier"]}],
        "tenants": [
            {"name": "tenant-a", "keys": [TENANT_KEY]},
            {"name": "tenant-env", "keys": ["os.environ/SPILLGATE_TENANT_KEY"]},
        ],
        "admin": {"keys": [ADMIN_KEY]},
        "health": {"interval_s": 0.2, "timeout_s": 1.0},
        "state": {"data_dir": str(tmp_path / "data")},
        **extra,
    }
    path = tmp_path / "spillgate.yaml"
    path.write_text(yaml.safe_dump(raw))
    return serve(path, tmp_path)


@pytest.fixture
def gateway(replica: RunningProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningProcess]:
    proc = start(replica, tmp_path, monkeypatch)
    yield proc
    proc.stop()


def refused_at(response: httpx.Response) -> dict[str, str]:
    assert response.status_code == 422, response.text
    return {p["path"]: p["message"] for p in response.json()["problems"]}


def with_pool(shown: dict[str, Any], url: str, api_key: str) -> dict[str, Any]:
    edit = copy.deepcopy(shown)
    edit["pools"].append({"name": "elsewhere", "served_model": "sim-model", "replicas": [url], "api_key": api_key})
    edit["routes"].append({"name": "elsewhere", "targets": ["elsewhere"]})
    return edit


def test_an_environment_key_is_not_sent_to_a_listener(gateway: RunningProcess, listener: Listener) -> None:
    shown = current(gateway)["config"]
    assert shown["hosted_models"][0]["api_key"] == "os.environ/SPILLGATE_PROVIDER_KEY"  # shown as written

    # The provider's key on a new hosted model pointing at the listener.
    exfil = copy.deepcopy(shown)
    exfil["hosted_models"].append(
        {
            "name": "exfil",
            "model": "openai/gpt-4o",
            "api_base": listener.url + "/v1",
            "api_key": "os.environ/SPILLGATE_PROVIDER_KEY",
        }
    )
    exfil["routes"].append({"name": "exfil", "targets": ["exfil"]})
    assert (
        "configured at start for https://api.openai.com:443"
        in refused_at(put(gateway, exfil))["hosted_models.1.api_key"]
    )
    # The replicas' key: the listener added to the pool, or a new pool using the same variable.
    added = copy.deepcopy(shown)
    added["pools"][0]["replicas"].append(listener.url)
    assert "may not be sent to " + listener.url in refused_at(put(gateway, added))["pools.0.api_key"]
    assert "pools.1.api_key" in refused_at(
        put(gateway, with_pool(shown, listener.url, "os.environ/SPILLGATE_REPLICA_KEY"))
    )
    # The provider's key to another provider, and a tenant key's variable as a provider key.
    moved = copy.deepcopy(shown)
    moved["hosted_models"][0].update(model="anthropic/claude-sonnet-4-5", api_base=None)
    assert "provider anthropic" in refused_at(put(gateway, moved))["hosted_models.0.api_key"]
    tenant_key = copy.deepcopy(shown)
    tenant_key["hosted_models"][0]["api_key"] = "os.environ/SPILLGATE_TENANT_KEY"
    assert "no upstream" in refused_at(put(gateway, tenant_key))["hosted_models.0.api_key"]

    # A key the admin sends itself is theirs to send: accepted, and the listener hears the liveness probe,
    # so it would have heard the refused ones.
    assert put(gateway, with_pool(shown, listener.url, "sk-the-admin-knows-this")).status_code == 200
    eventually(lambda: "Bearer sk-the-admin-knows-this" in listener.seen)
    time.sleep(0.5)
    assert not [h for h in listener.seen if PROVIDER_KEY in h or REPLICA_KEY in h or TENANT_KEY_IN_ENV in h]


def test_upstream_hosts_default_to_the_hosts_at_start(gateway: RunningProcess) -> None:
    shown = current(gateway)["config"]
    other_host = with_pool(shown, "http://127.0.0.2:30000", "sk-the-admin-knows-this")
    assert "by default the hosts of the config at start" in refused_at(put(gateway, other_host))["pools.1.replicas.0"]
    regional = copy.deepcopy(shown)
    regional["hosted_models"][0].update(api_base="https://eu.api.openai.com/v1", api_key="sk-the-admin-knows-this")
    assert "hosted_models.0.api_base" in refused_at(put(gateway, regional))
    # A start-up host is fine, on another port too, with a key of the admin's own.
    assert put(gateway, with_pool(shown, "http://127.0.0.1:9", "sk-the-admin-knows-this")).status_code == 200


def test_listed_upstream_hosts_may_receive_a_bound_key(
    replica: RunningProcess, listener: Listener, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``secrets.upstream_hosts`` is the operator's word, at start, that a host is theirs."""
    proc = start(replica, tmp_path, monkeypatch, secrets={"upstream_hosts": ["127.0.0.1", "api.openai.com"]})
    try:
        shown = current(proc)["config"]
        assert put(proc, with_pool(shown, listener.url, "os.environ/SPILLGATE_REPLICA_KEY")).status_code == 200
        eventually(lambda: f"Bearer {REPLICA_KEY}" in listener.seen)
        # A variable named at start for something else is sent nowhere, listed host or not.
        tenant_key = copy.deepcopy(shown)
        tenant_key["pools"][0]["api_key"] = "os.environ/SPILLGATE_TENANT_KEY"
        assert "no upstream" in refused_at(put(proc, tenant_key))["pools.0.api_key"]
    finally:
        proc.stop()
