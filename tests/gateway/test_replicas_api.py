"""One static replica added or drained through ``/admin/pools/{pool}/replicas``: a config version like any edit
(validated, in the history, held against the file), the admin API's error format for what it cannot take, and
the pool's key sent to a new replica only where the config at start allows it (a real listener records what it
is sent)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from spillgate.gateway.control.discovery import LOOPBACK_ENV
from tests.gateway.test_discovery import LABELS, NS, requests_seen
from tests.gateway.test_live_config import ADMIN, ADMIN_KEY, TENANT, eventually
from tests.gateway.test_secret_binding import Listener
from tests.support.gateway import TENANT_KEY, replica_name, running_replicas
from tests.support.kube_apiserver import KubeApiServer
from tests.support.procs import RunningProcess, free_port, start_spillgate

REPLICA_KEY = "sk-replica-key-for-api-adds-5e1"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RunningProcess]]:
    yield from running_replicas(tmp_path_factory.mktemp("api-replicas"), 3, "--time-scale", "0.05")


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.stop()


def serve(
    tmp_path: Path, pools: list[dict[str, Any]], env: dict[str, str] | None = None, **extra: Any
) -> RunningProcess:
    raw = {
        "pools": pools,
        "routes": [{"name": p["name"], "targets": [p["name"]], "policy": "round_robin"} for p in pools],
        "tenants": [{"name": "tenant-a", "keys": [TENANT_KEY]}],
        "admin": {"keys": [ADMIN_KEY]},
        "health": {"interval_s": 0.2, "timeout_s": 1.0, "unhealthy_after": 1},
        "state": {"data_dir": str(tmp_path / "data")},
        **extra,
    }
    path = tmp_path / "spillgate.yaml"
    path.write_text(yaml.safe_dump(raw))
    port = free_port()
    args = ["serve", "--config", str(path), "--port", str(port)]
    return start_spillgate(args, port=port, log_dir=tmp_path, env=env)


def add(gateway: RunningProcess, pool: str, url: object, headers: dict[str, str] = ADMIN) -> httpx.Response:
    return httpx.post(f"{gateway.url}/admin/pools/{pool}/replicas", json={"url": url}, headers=headers, timeout=30)


def remove(gateway: RunningProcess, pool: str, url: str) -> httpx.Response:
    return httpx.delete(f"{gateway.url}/admin/pools/{pool}/replicas", params={"url": url}, headers=ADMIN, timeout=30)


def ask(gateway: RunningProcess, route: str) -> str:
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": route, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers=TENANT,
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.headers["x-spillgate-backend"]


def error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert body["code"] == code, body
    return body


@pytest.fixture
def gateway(replicas: list[RunningProcess], tmp_path: Path) -> Iterator[tuple[RunningProcess, KubeApiServer]]:
    """Pool ``static`` over replica 0; pool ``found`` discovering pod ``d``, which is replica 1."""
    api = KubeApiServer()
    try:
        api.add_pod("d", "127.0.0.1", port=int(replicas[1].url.rsplit(":", 1)[1]), labels=LABELS, namespace=NS)
        pools = [
            {"name": "static", "served_model": "sim-model", "replicas": [replicas[0].url]},
            {
                "name": "found",
                "served_model": "sim-model",
                "discovery": {"kubernetes": {"namespace": NS, "label_selector": "app=sim", "port": "http"}},
            },
        ]
        env = {"KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig")), LOOPBACK_ENV: "1"}
        proc = serve(tmp_path, pools, env=env)
        yield proc, api
        proc.stop()
    finally:
        api.stop()


def test_a_replica_added_then_drained_through_the_api_is_a_config_version(
    gateway: tuple[RunningProcess, KubeApiServer], replicas: list[RunningProcess]
) -> None:
    proc, _ = gateway
    added = add(proc, "static", replicas[2].url)
    assert added.status_code == 200, added.text
    assert added.json()["diff"] == [f"pools.0.replicas.1: added {replicas[2].url!r}"]
    names = {replica_name(replicas[0], "static"), replica_name(replicas[2], "static")}
    assert {ask(proc, "static") for _ in range(4)} == names
    shown = httpx.get(proc.url + "/admin/config", headers=ADMIN).json()
    assert shown["config"]["pools"][0]["replicas"] == [replicas[0].url, replicas[2].url]
    assert shown["file"]["not_in_file"] == [f"pools.0.replicas.1: added {replicas[2].url!r}"]
    latest = httpx.get(proc.url + "/admin/config/history", headers=ADMIN).json()["versions"][-1]
    assert latest["version"] == added.json()["version"] and latest["author"].startswith("admin:")

    removed = remove(proc, "static", replicas[0].url)
    assert removed.status_code == 200, removed.text
    before = requests_seen(replicas[0])
    assert {ask(proc, "static") for _ in range(4)} == {replica_name(replicas[2], "static")}, "its name kept"
    assert requests_seen(replicas[0]) == before, "the removed replica gets no new request"
    assert requests_seen(replicas[2]) >= 4
    origins = {
        b["name"]: b.get("origin") for b in httpx.get(proc.url + "/admin/backends", headers=ADMIN).json()["backends"]
    }
    assert origins == {replica_name(replicas[2], "static"): "config", "found/d": "discovered"}


def test_what_the_api_cannot_take_is_refused_in_its_error_format(
    gateway: tuple[RunningProcess, KubeApiServer], replicas: list[RunningProcess]
) -> None:
    proc, _ = gateway
    error(add(proc, "nope", replicas[2].url), 404, "pool_not_found")
    error(add(proc, "static", "not a url"), 422, "invalid_replica_url")
    error(add(proc, "static", "http://127.0.0.1:80/v1"), 422, "invalid_replica_url")
    error(add(proc, "static", None), 422, "invalid_replica_url")
    error(add(proc, "static", replicas[0].url), 409, "replica_exists")
    error(add(proc, "static", replicas[0].url + "/"), 409, "replica_exists")
    assert "discovery found it" in error(add(proc, "found", replicas[1].url), 409, "replica_exists")["message"]
    error(remove(proc, "static", replicas[2].url), 404, "replica_not_found")
    message = error(remove(proc, "found", replicas[1].url), 409, "replica_discovered")["message"]
    assert "discovered (pod 'd')" in message and "its pod" in message
    refused = add(proc, "static", "http://10.9.8.7:30000")
    body = error(refused, 422, "invalid_config")
    assert refused.json()["problems"] == [
        {
            "path": "pools.0.replicas.1",
            "message": "http://10.9.8.7:30000 is not in secrets.upstream_hosts "
            "(by default the hosts of the config at start)",
        }
    ], body
    tenant = add(proc, "static", replicas[2].url, headers=TENANT)
    assert tenant.status_code == 403, tenant.text
    anonymous = httpx.post(f"{proc.url}/admin/pools/static/replicas", json={"url": replicas[2].url})
    assert anonymous.status_code == 401, anonymous.text
    versions = httpx.get(proc.url + "/admin/config/history", headers=ADMIN).json()["versions"]
    assert len(versions) == 1, "nothing refused became a version"


def test_a_replica_url_that_does_not_parse_is_refused_through_the_api_and_the_file(
    gateway: tuple[RunningProcess, KubeApiServer], replicas: list[RunningProcess], tmp_path: Path
) -> None:
    proc, _ = gateway
    for url in ("http://[::1", "http://127.0.0.1:abc", "http://127.0.0.1:99999", "http://127.0.0.1:0"):
        error(add(proc, "static", url), 422, "invalid_replica_url")
        error(remove(proc, "static", url), 422, "invalid_replica_url")
    # The same URL in the config file is a file refused, by field; the file watch goes on and applies the next.
    path = tmp_path / "spillgate.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["pools"][0]["replicas"].append("http://[::1")
    path.write_text(yaml.safe_dump(raw))

    def file_status() -> dict[str, Any]:
        return httpx.get(proc.url + "/admin/config", headers=ADMIN).json()["file"]

    eventually(lambda: file_status()["not_applied"] is not None)
    problems = file_status()["not_applied"]["problems"]
    assert [p["path"] for p in problems] == ["pools.0.replicas.1"], problems
    raw["pools"][0]["replicas"][1] = replicas[2].url
    path.write_text(yaml.safe_dump(raw))
    eventually(lambda: file_status()["in_sync"])
    names = {replica_name(replicas[0], "static"), replica_name(replicas[2], "static")}
    assert {ask(proc, "static") for _ in range(4)} == names


def keyed_pool(replica: RunningProcess) -> list[dict[str, Any]]:
    return [
        {
            "name": "keyed",
            "served_model": "sim-model",
            "replicas": [replica.url],
            "api_key": "os.environ/SPILLGATE_REPLICA_KEY",
        }
    ]


def test_an_admin_adding_a_replica_at_its_own_host_does_not_get_the_pool_key(
    replicas: list[RunningProcess], listener: Listener, tmp_path: Path
) -> None:
    # The listener is on the replica's own host, which secrets.upstream_hosts allows by default: only the key's
    # binding to where the config at start sent it keeps the key from it.
    proc = serve(tmp_path, keyed_pool(replicas[0]), env={"SPILLGATE_REPLICA_KEY": REPLICA_KEY})
    try:
        refused = add(proc, "keyed", listener.url)
        error(refused, 422, "invalid_config")
        assert [p["path"] for p in refused.json()["problems"]] == ["pools.0.api_key"]
        assert "may not be sent to" in refused.json()["problems"][0]["message"]
        for _ in range(3):
            assert ask(proc, "keyed") == replica_name(replicas[0], "keyed")
        assert listener.seen == [], "the listener heard nothing, the key least of all"
    finally:
        proc.stop()


def test_a_replica_added_at_a_listed_host_gets_the_pool_key(
    replicas: list[RunningProcess], listener: Listener, tmp_path: Path
) -> None:
    """The listener does hear the key when the config at start lists its host: the test above can fail."""
    proc = serve(
        tmp_path,
        keyed_pool(replicas[0]),
        env={"SPILLGATE_REPLICA_KEY": REPLICA_KEY},
        secrets={"upstream_hosts": ["127.0.0.1"]},
    )
    try:
        added = add(proc, "keyed", listener.url)
        assert added.status_code == 200, added.text
        eventually(lambda: f"Bearer {REPLICA_KEY}" in listener.seen)
    finally:
        proc.stop()


def test_draining_the_first_of_three_renames_no_other_and_keeps_what_was_learned_of_them(
    replicas: list[RunningProcess], tmp_path: Path
) -> None:
    route = {"name": "static", "targets": ["static"], "policy": "cache_aware"}
    pools = [{"name": "static", "served_model": "sim-model", "replicas": [r.url for r in replicas]}]
    proc = serve(tmp_path, pools, routes=[route])
    try:
        first, *others = (replica_name(r, "static") for r in replicas)
        for attempt in range(20):  # a long prompt the cache-aware route sends to a replica that stays
            prompt = f"attempt {attempt}: " + "a long shared document, " * 150
            home, _ = chat(proc, prompt)
            if home != first:
                break
        assert home in others
        assert chat(proc, prompt) == (home, "prefix_hit")
        learned = httpx.get(proc.url + "/health").json()["backends"][home]

        removed = remove(proc, "static", replicas[0].url)
        assert removed.status_code == 200, removed.text
        backends = httpx.get(proc.url + "/health").json()["backends"]
        assert set(backends) == set(others), "the others kept their names"
        assert (backends[home]["ttft_ms"], backends[home]["tpot_ms"]) == (learned["ttft_ms"], learned["tpot_ms"])
        assert chat(proc, prompt) == (home, "prefix_hit"), "the prefix index still knows what it holds"

        added = httpx.post(
            f"{proc.url}/admin/pools/static/replicas",
            json={"url": replicas[0].url, "name": "back"},
            headers=ADMIN,
            timeout=30,
        )
        assert added.status_code == 200, added.text
        listed = httpx.get(proc.url + "/admin/backends", headers=ADMIN).json()["backends"]
        assert {b["name"]: b["url"] for b in listed} == {
            "static/back": replicas[0].url,
            **{name: r.url for name, r in zip(others, replicas[1:], strict=True)},
        }
        refused = httpx.post(
            f"{proc.url}/admin/pools/static/replicas",
            json={"url": "http://127.0.0.1:9", "name": "back"},
            headers=ADMIN,
            timeout=30,
        )
        assert error(refused, 422, "invalid_config")["param"] == "pools.0.replicas.3.name"

        by_name = httpx.delete(
            f"{proc.url}/admin/pools/static/replicas", params={"name": "static/back"}, headers=ADMIN, timeout=30
        )
        assert by_name.status_code == 200, by_name.text
        listed = httpx.get(proc.url + "/admin/backends", headers=ADMIN).json()["backends"]
        assert sorted(b["name"] for b in listed) == sorted(others), "drained by the name it was listed by"
        gone = httpx.delete(
            f"{proc.url}/admin/pools/static/replicas", params={"name": "back"}, headers=ADMIN, timeout=30
        )
        assert error(gone, 404, "replica_not_found")["param"] == "name"
    finally:
        proc.stop()


def chat(gateway: RunningProcess, prompt: str) -> tuple[str, str]:
    """Which backend answered ``prompt`` on route ``static``, and why it was chosen."""
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": "static", "messages": [{"role": "user", "content": prompt}], "max_tokens": 2},
        headers=TENANT,
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.headers["x-spillgate-backend"], response.headers["x-spillgate-reason"]
