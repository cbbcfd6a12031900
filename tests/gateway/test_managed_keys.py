"""Managed keys on one real gateway without Redis: made, used through the OpenAI SDK, listed without secrets,
rotated, revoked and expired, refused the admin API, kept in the data directory across a restart, and held to
limits of their own."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.gateway import start_gateway, start_replica
from tests.support.procs import RunningProcess

ADMIN_KEY = "sk-keys-admin"
CONFIG_KEY = "sk-keys-config-acme"
OTHER_CONFIG_KEY = "sk-keys-config-acme-2"
INVALID_KEY = "Invalid or missing API key. Pass it as 'Authorization: Bearer <key>'."


def keys_config(replica: RunningProcess, data_dir: Path, **state: Any) -> dict[str, Any]:
    return {
        "pools": [{"name": "pool", "served_model": "sim-model", "replicas": [replica.url]}],
        "routes": [{"name": "chat", "targets": ["pool"], "policy": "least_load"}],
        "tenants": [
            {"name": "acme", "keys": [CONFIG_KEY, OTHER_CONFIG_KEY]},
            {"name": "globex", "keys": ["sk-keys-config-globex"]},
        ],
        "admin": {"keys": [ADMIN_KEY]},
        "health": {"interval_s": 0.2, "timeout_s": 1.0, "unhealthy_after": 1},
        "state": {"data_dir": str(data_dir), **state},
    }


def admin(gateway: RunningProcess, method: str, path: str, key: str = ADMIN_KEY, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, gateway.url + path, headers={"authorization": f"Bearer {key}"}, timeout=30, **kwargs)


def create(gateway: RunningProcess, **body: Any) -> dict[str, Any]:
    response = admin(gateway, "POST", "/admin/keys", json={"tenant": "acme", **body})
    assert response.status_code == 201, response.text
    return response.json()


def chat(gateway: RunningProcess, key: str) -> str:
    """One completion through the official SDK; its text."""
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)
    answer = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hello"}], max_tokens=3)
    return answer.choices[0].message.content or ""


def status_of(gateway: RunningProcess, key: str, max_tokens: int = 2) -> int:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    response = httpx.post(
        gateway.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=30
    )
    return response.status_code


def refused_as_unknown(gateway: RunningProcess, key: str) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert refused.value.status_code == 401
    assert refused.value.body["message"] == INVALID_KEY  # type: ignore[index]


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    proc = start_replica(tmp_path_factory.mktemp("keys-replica"), "--time-scale", "0.01")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("keys-data")


@pytest.fixture(scope="module")
def gateway(
    replica: RunningProcess, data_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProcess]:
    proc = start_gateway(keys_config(replica, data_dir), tmp_path_factory.mktemp("keys-gateway"))
    yield proc
    proc.stop()


def test_a_new_key_is_shown_once_and_serves_its_tenant(gateway: RunningProcess) -> None:
    made = create(gateway, name="ci runner")
    key = made["key"]
    assert key.startswith("sk-sg-") and len(key) >= len("sk-sg-") + 43
    assert made["id"].startswith("key_")
    assert made["prefix"] == key[len("sk-sg-") : len("sk-sg-") + 8]
    assert (made["tenant"], made["name"], made["expires_at"], made["active"]) == ("acme", "ci runner", None, True)
    assert chat(gateway, key)
    assert admin(gateway, "GET", "/v1/spend", key=key).json()["tenant"] == "acme"

    listed = admin(gateway, "GET", "/admin/keys").text
    one = admin(gateway, "GET", f"/admin/keys/{made['id']}")
    for shown in (listed, one.text):
        assert key not in shown
        assert hashlib.sha256(key.encode()).hexdigest() not in shown
        assert "digest" not in shown
    assert one.json()["prefix"] == made["prefix"] and "key" not in one.json()
    assert made["id"] in listed


def test_the_list_filters_by_tenant(gateway: RunningProcess) -> None:
    made = create(gateway)
    mine = admin(gateway, "GET", "/admin/keys", params={"tenant": "acme"}).json()["data"]
    theirs = admin(gateway, "GET", "/admin/keys", params={"tenant": "globex"}).json()["data"]
    assert made["id"] in [k["id"] for k in mine]
    assert theirs == []


def test_only_an_admin_key_manages_keys(gateway: RunningProcess) -> None:
    managed = create(gateway)["key"]
    for key in (CONFIG_KEY, managed):
        for method, path in (("GET", "/admin/keys"), ("POST", "/admin/keys")):
            refused = admin(gateway, method, path, key=key, json={"tenant": "acme"})
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"]["code"] == "admin_key_required"
    assert admin(gateway, "GET", "/admin/keys", key="sk-sg-made-up").status_code == 401


def test_bad_requests_get_clear_errors(gateway: RunningProcess) -> None:
    unknown = admin(gateway, "POST", "/admin/keys", json={"tenant": "nobody"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "tenant_not_found"
    assert "nobody" in unknown.json()["error"]["message"]
    past = admin(gateway, "POST", "/admin/keys", json={"tenant": "acme", "expires_at": "2001-01-01T00:00:00Z"})
    assert past.status_code == 400 and past.json()["error"]["param"] == "expires_at"
    both = admin(gateway, "POST", "/admin/keys", json={"tenant": "acme", "expires_at": 4e9, "expires_in_s": 60})
    assert both.status_code == 400
    typo = admin(gateway, "POST", "/admin/keys", json={"tenant": "acme", "limits": {"rpm": 3}})
    assert typo.status_code == 422 and "error" in typo.json()
    assert admin(gateway, "GET", "/admin/keys/key_nothing").status_code == 404
    assert admin(gateway, "DELETE", "/admin/keys/key_nothing").status_code == 404


def test_an_iso_expiry_is_kept(gateway: RunningProcess) -> None:
    made = create(gateway, expires_at="2099-01-02T03:04:05+00:00")
    assert made["expires_at"] == int(datetime(2099, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp())


def test_a_revoked_key_fails_like_an_unknown_one(gateway: RunningProcess) -> None:
    made = create(gateway)
    assert chat(gateway, made["key"])
    revoked = admin(gateway, "DELETE", f"/admin/keys/{made['id']}")
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    refused_as_unknown(gateway, made["key"])
    assert chat(gateway, CONFIG_KEY)


def test_an_expired_key_fails_like_an_unknown_one(gateway: RunningProcess) -> None:
    made = create(gateway, expires_in_s=1)
    assert chat(gateway, made["key"])
    time.sleep(max(0.0, made["expires_at"] + 1.05 - time.time()))
    refused_as_unknown(gateway, made["key"])
    assert admin(gateway, "GET", f"/admin/keys/{made['id']}").json()["expired"] is True


def test_rotation_replaces_the_key_at_once(gateway: RunningProcess) -> None:
    old = create(gateway, name="rotating", limits={"requests_per_minute": 1000})
    rotated = admin(gateway, "POST", f"/admin/keys/{old['id']}/rotate")
    assert rotated.status_code == 201, rotated.text
    new = rotated.json()
    assert new["key"] != old["key"] and new["id"] != old["id"]
    assert (new["tenant"], new["name"], new["limits"], new["rotated_from"]) == (
        "acme",
        "rotating",
        old["limits"],
        old["id"],
    )
    assert new["previous"]["revoked"] is True
    refused_as_unknown(gateway, old["key"])
    assert chat(gateway, new["key"])
    again = admin(gateway, "POST", f"/admin/keys/{old['id']}/rotate")
    assert again.status_code == 409


def test_rotation_with_grace_keeps_both_keys_working_until_it_ends(gateway: RunningProcess) -> None:
    old = create(gateway)
    rotated = admin(gateway, "POST", f"/admin/keys/{old['id']}/rotate", json={"grace_s": 2})
    new = rotated.json()
    assert chat(gateway, old["key"]) and chat(gateway, new["key"])
    time.sleep(max(0.0, new["previous"]["revoked_at"] + 1.05 - time.time()))
    refused_as_unknown(gateway, old["key"])
    assert chat(gateway, new["key"])


def test_a_key_with_its_own_rate_limit_is_refused_while_its_tenant_is_not(gateway: RunningProcess) -> None:
    limited = create(gateway, limits={"requests_per_minute": 2})["key"]
    assert [status_of(gateway, limited) for _ in range(3)] == [200, 200, 429]
    assert status_of(gateway, CONFIG_KEY) == 200
    other = create(gateway)["key"]
    assert status_of(gateway, other) == 200


def test_keys_survive_a_restart_in_a_private_file(replica: RunningProcess, tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = keys_config(replica, data)
    first = start_gateway(config, tmp_path)
    try:
        kept = create(first)
        gone = create(first)
        assert admin(first, "DELETE", f"/admin/keys/{gone['id']}").status_code == 200
    finally:
        first.stop()
    stored = data / "managed-keys.json"
    assert os.stat(stored).st_mode & 0o777 == 0o600
    assert kept["key"] not in stored.read_text()
    second = start_gateway(config, tmp_path)
    try:
        assert chat(second, kept["key"])
        refused_as_unknown(second, gone["key"])
        listed = {k["id"]: k for k in admin(second, "GET", "/admin/keys").json()["data"]}
        assert listed[kept["id"]]["active"] and listed[gone["id"]]["revoked"]
        assert listed[kept["id"]]["last_used_at"] is not None
    finally:
        second.stop()


def test_a_key_with_its_own_daily_budget_is_refused_past_it(replica: RunningProcess, tmp_path: Path) -> None:
    """A pool priced so a request costs its output tokens in dollars: a $12 key budget pays for two requests of
    5 tokens, not a third; the tenant's config key still gets through."""
    config = keys_config(replica, tmp_path / "data")
    config["pools"][0] |= {"gpu_usd_per_hour": 3600, "output_tokens_per_s": 1, "prefill_tokens_per_s": 1e9}
    gateway = start_gateway(config, tmp_path)
    try:
        key = create(gateway, budget={"usd_per_day": 12})["key"]
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}

        def ask(bearer: str) -> httpx.Response:
            headers = {"authorization": f"Bearer {bearer}"}
            return httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)

        assert [ask(key).status_code for _ in range(2)] == [200, 200]
        refused = ask(key)
        assert refused.status_code == 429, refused.text
        assert "own limit" in refused.json()["error"]["message"]
        assert ask(CONFIG_KEY).status_code == 200
    finally:
        gateway.stop()


def test_a_config_edit_keeps_managed_keys_working_at_once(gateway: RunningProcess) -> None:
    made = create(gateway)
    config = admin(gateway, "GET", "/admin/config").json()["config"]
    config["routes"][0]["aliases"] = [*config["routes"][0].get("aliases", []), f"chat-{made['id']}"]
    edited = admin(gateway, "PUT", "/admin/config", json=config)
    assert edited.status_code == 200, edited.text
    assert status_of(gateway, made["key"]) == 200, "the new version's tenants must know the managed keys at once"
