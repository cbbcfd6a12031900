"""Live policy edits through the admin API and the YAML file: validated whole, applied to the next
request without a restart, versioned with who and what, rolled back, kept across restarts, and shared
by every gateway process through Redis."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from tests.support.gateway import TENANT_KEY, pool_of, replica_name, running_replicas
from tests.support.procs import RunningProcess, free_port, start_spillgate

ADMIN_KEY = "sk-test-admin"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
TENANT = {"authorization": f"Bearer {TENANT_KEY}"}


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RunningProcess]]:
    """Two replicas of this module's own: ``blue`` and ``green`` in :func:`base_config`."""
    yield from running_replicas(tmp_path_factory.mktemp("live-replicas"), 2, "--time-scale", "0.05")


def base_config(replicas: list[RunningProcess], data_dir: Path, **state: Any) -> dict[str, Any]:
    return {
        "pools": [
            {"name": "blue", "served_model": "sim-model", "replicas": [replicas[0].url]},
            {"name": "green", "served_model": "sim-model", "replicas": [replicas[1].url]},
        ],
        "routes": [{"name": "chat", "targets": ["blue"], "policy": "least_load"}],
        "tenants": [{"name": "tenant-a", "keys": [TENANT_KEY]}],
        "admin": {"keys": [ADMIN_KEY]},
        "health": {"interval_s": 0.2, "timeout_s": 1.0, "unhealthy_after": 1},
        "state": {"data_dir": str(data_dir), **state},
    }


def serve(path: Path, log_dir: Path, port: int | None = None) -> RunningProcess:
    port = port or free_port()
    return start_spillgate(["serve", "--config", str(path), "--port", str(port)], port=port, log_dir=log_dir)


def backend_of(gateway: RunningProcess, model: str = "chat") -> str:
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers=TENANT,
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.headers["x-spillgate-backend"]


def current(gateway: RunningProcess) -> dict[str, Any]:
    response = httpx.get(gateway.url + "/admin/config", headers=ADMIN)
    assert response.status_code == 200, response.text
    return response.json()


def put(gateway: RunningProcess, config: dict[str, Any]) -> httpx.Response:
    return httpx.put(gateway.url + "/admin/config", json=config, headers=ADMIN, timeout=30)


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


@pytest.fixture
def gateway(replicas: list[RunningProcess], tmp_path: Path) -> Iterator[tuple[RunningProcess, Path]]:
    path = tmp_path / "spillgate.yaml"
    path.write_text(yaml.safe_dump(base_config(replicas, tmp_path / "data")))
    proc = serve(path, tmp_path)
    yield proc, path
    proc.stop()


def test_admin_api_needs_an_admin_key(gateway: tuple[RunningProcess, Path]) -> None:
    proc, path = gateway
    assert httpx.get(proc.url + "/admin/config").status_code == 401
    assert httpx.get(proc.url + "/admin/config", headers=TENANT).status_code == 403
    assert httpx.put(proc.url + "/admin/config", json={}, headers=TENANT).status_code == 403
    # Admin keys are not tenant keys: they cannot spend on completions.
    response = httpx.post(
        proc.url + "/v1/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
        headers=ADMIN,
    )
    assert response.status_code == 401
    shown = current(proc)
    assert shown["version"] == 1
    [history] = (path.parent / "data").glob("config-history.*.jsonl")
    stored = history.read_text()
    assert TENANT_KEY not in stored and ADMIN_KEY not in stored, "versions are stored without secrets"
    assert TENANT_KEY not in str(shown) and ADMIN_KEY not in str(shown)
    assert shown["config"]["tenants"][0]["keys"][0].startswith("sha256:")


def test_invalid_edit_changes_nothing_and_lists_every_problem(gateway: tuple[RunningProcess, Path]) -> None:
    proc, _ = gateway
    before = current(proc)
    config = copy.deepcopy(before["config"])
    config["routes"][0]["targets"] = ["green", "purple"]
    config["routes"][0]["policy"] = "telepathy"
    config["limits"] = {"max_tokens": -5}
    response = put(proc, config)
    assert response.status_code == 422
    body = response.json()
    assert body["error"]["code"] == "invalid_config" and "unchanged" in body["error"]["message"]
    paths = [p["path"] for p in body["problems"]]
    assert paths == ["limits.max_tokens", "routes.0.policy", "routes.0.targets.1"], body["problems"]
    # Each fixed in turn, the others are still reported.
    config["routes"][0]["policy"] = "least_load"
    config["limits"] = {}
    assert put(proc, config).json()["problems"] == [
        {"path": "routes.0.targets.1", "message": "unknown target 'purple'; known: ['blue', 'green']"}
    ]
    assert current(proc) == before
    assert pool_of(backend_of(proc)) == "blue"
    restart_only = before["config"] | {"listen": {"port": 1}}
    problems = put(proc, restart_only).json()["problems"]
    assert problems[0]["path"] == "listen" and "restart" in problems[0]["message"]
    assert httpx.put(proc.url + "/admin/config", content=b"{not json", headers=ADMIN).status_code == 400


def test_an_edit_may_not_drop_the_admin_key_it_was_made_with(gateway: tuple[RunningProcess, Path]) -> None:
    proc, _ = gateway
    before = current(proc)
    for admin in ({"keys": []}, None):
        config = copy.deepcopy(before["config"])
        if admin is None:
            del config["admin"]
        else:
            config["admin"] = admin
        response = put(proc, config)
        assert response.status_code == 422, response.text
        assert response.json()["problems"][0]["path"] == "admin.keys"
        assert "must keep the admin key" in response.json()["error"]["message"]
    assert current(proc) == before, "refused whole: the running config and the admin API are as they were"
    # Another admin key may take over: then the old one may go, by a change made with the new one.
    config = copy.deepcopy(before["config"])
    config["admin"]["keys"].append("sk-test-admin-2")
    assert put(proc, config).status_code == 200
    config["admin"]["keys"] = ["sk-test-admin-2"]
    other = {"authorization": "Bearer sk-test-admin-2"}
    assert httpx.put(proc.url + "/admin/config", json=config, headers=other, timeout=30).status_code == 200
    assert httpx.get(proc.url + "/admin/config", headers=ADMIN).status_code == 401
    # Rolling back to version 1 would drop the key making the change: refused as well.
    rollback = httpx.post(proc.url + "/admin/config/rollback/1", headers=other, timeout=30)
    assert rollback.status_code == 422 and rollback.json()["problems"][0]["path"] == "admin.keys"


def test_valid_edit_routes_the_next_request_then_rolls_back(gateway: tuple[RunningProcess, Path]) -> None:
    proc, _ = gateway
    assert pool_of(backend_of(proc)) == "blue"
    config = current(proc)["config"]
    config["routes"][0]["targets"] = ["green"]
    response = put(proc, config)
    assert response.status_code == 200, response.text
    assert response.json()["version"] == 2
    assert response.json()["diff"] == ["routes.0.targets.0: 'blue' -> 'green'"]
    assert pool_of(backend_of(proc)) == "green"
    history = httpx.get(proc.url + "/admin/config/history", headers=ADMIN).json()
    assert [v["version"] for v in history["versions"]] == [1, 2]
    assert history["versions"][1]["author"].startswith("admin:")
    assert history["versions"][1]["diff"] == ["routes.0.targets.0: 'blue' -> 'green'"]
    rolled = httpx.post(proc.url + "/admin/config/rollback/1", headers=ADMIN)
    assert rolled.status_code == 200 and rolled.json()["version"] == 3
    assert pool_of(backend_of(proc)) == "blue"
    assert httpx.post(proc.url + "/admin/config/rollback/99", headers=ADMIN).status_code == 404


def test_an_edit_made_on_an_older_version_is_refused_when_it_names_its_base(
    gateway: tuple[RunningProcess, Path],
) -> None:
    proc, _ = gateway
    read = httpx.get(proc.url + "/admin/config", headers=ADMIN)
    assert read.headers["etag"] == '"1"'
    mine = copy.deepcopy(read.json()["config"])
    theirs = copy.deepcopy(mine)
    theirs["routes"][0]["targets"] = ["green"]
    assert httpx.put(proc.url + "/admin/config", json=theirs, headers={**ADMIN, "if-match": '"1"'}).status_code == 200
    mine["routes"][0]["policy"] = "round_robin"
    stale = httpx.put(proc.url + "/admin/config", json=mine, headers={**ADMIN, "if-match": read.headers["etag"]})
    assert stale.status_code == 412, stale.text
    assert stale.json()["error"]["code"] == "config_version_mismatch"
    assert "version 2 runs now" in stale.json()["error"]["message"]
    assert current(proc)["version"] == 2 and pool_of(backend_of(proc)) == "green"
    garbled = httpx.put(proc.url + "/admin/config", json=mine, headers={**ADMIN, "if-match": "yesterday"})
    assert garbled.status_code == 400 and garbled.json()["error"]["param"] == "If-Match"
    assert current(proc)["version"] == 2


def test_a_live_edit_tunes_the_affinity_guard_of_a_cache_aware_route(gateway: tuple[RunningProcess, Path]) -> None:
    proc, _ = gateway
    config = current(proc)["config"]
    config["routes"][0]["affinity"] = {"max_slowdown": 3}
    refused = put(proc, config)  # the route is still least_load, which has no such guard
    assert refused.status_code == 422
    assert refused.json()["problems"] == [
        {"path": "routes.0.affinity", "message": "only cache_aware has an affinity guard, not least_load"}
    ]
    config["routes"][0]["policy"] = "cache_aware"
    accepted = put(proc, config)
    assert accepted.status_code == 200, accepted.text
    assert any(line.startswith("routes.0.affinity") for line in accepted.json()["diff"]), accepted.json()["diff"]
    assert current(proc)["config"]["routes"][0]["affinity"]["max_slowdown"] == 3
    assert pool_of(backend_of(proc)) == "blue", "the edited route still serves"


def test_a_replica_name_moved_to_another_address_starts_with_no_cached_prefix(
    gateway: tuple[RunningProcess, Path], replicas: list[RunningProcess]
) -> None:
    proc, _ = gateway
    config = current(proc)["config"]
    config["routes"][0]["policy"] = "cache_aware"
    config["pools"][0]["replicas"] = [{"url": replicas[0].url, "name": "main"}]  # named: blue/main
    assert put(proc, config).status_code == 200
    prompt = f"{time.time_ns()} " + "a long shared document, " * 120

    def reason() -> str:
        response = httpx.post(
            proc.url + "/v1/chat/completions",
            json={"model": "chat", "messages": [{"role": "user", "content": prompt}], "max_tokens": 2},
            headers=TENANT,
            timeout=30,
        )
        assert response.status_code == 200, response.text
        assert response.headers["x-spillgate-backend"] == "blue/main"
        return response.headers["x-spillgate-reason"]

    reason()
    assert reason() == "prefix_hit", "the index knows what blue/main holds"
    config["pools"][0]["replicas"] = [{"url": replicas[1].url, "name": "main"}]  # another server, its cache empty
    assert put(proc, config).status_code == 200
    assert reason() != "prefix_hit", "what the old blue/main held must not be predicted for the new one"
    assert reason() == "prefix_hit"


def test_a_backend_removed_by_an_edit_leaves_the_health_report_and_the_gauges(
    gateway: tuple[RunningProcess, Path], replicas: list[RunningProcess]
) -> None:
    proc, _ = gateway
    blue, green = replica_name(replicas[0], "blue"), replica_name(replicas[1], "green")
    assert f'spillgate_backend_healthy{{backend="{green}"}} 1.0' in httpx.get(proc.url + "/metrics").text
    config = current(proc)["config"]
    config["pools"] = [pool for pool in config["pools"] if pool["name"] != "green"]
    assert put(proc, config).status_code == 200
    assert set(httpx.get(proc.url + "/health").json()["backends"]) == {blue}
    metrics = httpx.get(proc.url + "/metrics").text
    assert f'spillgate_backend_healthy{{backend="{blue}"}} 1.0' in metrics
    assert [line for line in metrics.splitlines() if line.startswith("spillgate_backend_") and green in line] == []


def test_in_flight_requests_finish_under_the_old_version(gateway: tuple[RunningProcess, Path]) -> None:
    proc, _ = gateway
    outcome: dict[str, object] = {}

    def long_stream() -> None:
        body = {"model": "chat", "messages": [{"role": "user", "content": "go"}], "max_tokens": 300, "stream": True}
        with httpx.stream("POST", proc.url + "/v1/chat/completions", json=body, headers=TENANT, timeout=60) as r:
            outcome["status"] = r.status_code
            outcome["lines"] = [line for line in r.iter_lines() if line]

    thread = threading.Thread(target=long_stream)
    thread.start()
    time.sleep(0.3)
    config = current(proc)["config"]
    config["routes"][0]["name"] = "renamed"
    assert put(proc, config).status_code == 200
    thread.join()
    assert outcome["status"] == 200 and outcome["lines"][-1] == "data: [DONE]"
    gone = httpx.post(
        proc.url + "/v1/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
        headers=TENANT,
    )
    assert gone.status_code == 404
    assert pool_of(backend_of(proc, "renamed")) == "blue"


def test_file_edits_apply_live_and_api_edits_survive_a_restart(replicas: list[RunningProcess], tmp_path: Path) -> None:
    path = tmp_path / "spillgate.yaml"
    config = base_config(replicas, tmp_path / "data")
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    proc = serve(path, tmp_path, port)
    try:
        config["routes"][0]["targets"] = ["green"]
        path.write_text(yaml.safe_dump(config))
        eventually(lambda: current(proc)["version"] == 2)
        assert pool_of(backend_of(proc)) == "green"
        assert current(proc)["config"]["routes"][0]["targets"] == ["green"]
        path.write_text("routes: [this is: not valid")  # refused: the running version stays
        time.sleep(1.5)
        assert current(proc)["version"] == 2 and pool_of(backend_of(proc)) == "green"
        path.write_text(yaml.safe_dump(config))
        edited = current(proc)["config"]
        edited["routes"][0]["policy"] = "round_robin"
        assert put(proc, edited).status_code == 200
    finally:
        proc.stop()
    proc = serve(path, tmp_path, port)
    try:
        after = current(proc)
        assert after["version"] == 3, "the API edit made after the file was read is kept"
        assert after["config"]["routes"][0]["policy"] == "round_robin"
    finally:
        proc.stop()


def test_every_process_applies_the_same_version_through_redis(
    replicas: list[RunningProcess], tmp_path: Path, redis_url: str
) -> None:
    state = {"redis_url": redis_url, "key_prefix": f"live-{free_port()}"}
    gateways: list[RunningProcess] = []
    try:
        for name in ("one", "two"):  # inside the try: a second one failing to start must not leave the first
            path = tmp_path / f"{name}.yaml"
            path.write_text(yaml.safe_dump(base_config(replicas, tmp_path / name, **state)))
            gateways.append(serve(path, tmp_path))
        one, two = gateways
        config = current(one)["config"]
        config["routes"][0]["targets"] = ["green"]
        version = put(one, config).json()["version"]
        eventually(lambda: current(two)["version"] == version, timeout=5)
        shared = str(redis.Redis.from_url(redis_url).hgetall(f"{state['key_prefix']}:config:versions"))
        assert "routes" in shared and TENANT_KEY not in shared and ADMIN_KEY not in shared, "shared without secrets"
        assert pool_of(backend_of(two)) == "green"
        # Versions are numbered fleet-wide: an edit on the other process comes next. Start-up settings
        # (here each process's own data directory) may be left out of an edit.
        del config["state"]
        config["routes"][0]["targets"] = ["blue"]
        assert put(two, config).json()["version"] == version + 1
        eventually(lambda: current(one)["version"] == version + 1, timeout=5)
        assert pool_of(backend_of(one)) == "blue"
        # Redis comes back empty: the next edit still numbers past every version seen, so the other
        # process takes it rather than ignoring a version 1.
        store = redis.Redis.from_url(redis_url)
        store.delete(*store.keys(f"{state['key_prefix']}:*"))
        config["routes"][0]["targets"] = ["green"]
        assert put(one, config).json()["version"] == version + 2
        eventually(lambda: current(two)["version"] == version + 2, timeout=5)
        assert pool_of(backend_of(two)) == "green"
    finally:
        for proc in gateways:
            proc.stop()


def test_a_version_that_dropped_a_simulated_backend_can_be_rolled_back(tmp_path: Path) -> None:
    # Simulators start with the process and keep running whatever version runs: a version may leave one out,
    # and a later one (or a rollback) bring it back.
    config = {
        "pools": [
            {"name": "sims", "served_model": "m", "simulated": {"count": 1, "time_scale": 0.05}},
        ],
        "hosted_models": [
            {
                "name": "frontier",
                "model": "openai/frontier-large",
                "api_key": "sk-simulated",
                "input_per_mtok": 3,
                "output_per_mtok": 15,
                "simulated": {"ttft_ms": 10, "tpot_ms": 1},
            }
        ],
        "routes": [{"name": "chat", "targets": ["sims"]}, {"name": "frontier", "targets": ["frontier"]}],
        "tenants": [{"name": "tenant-a", "keys": [TENANT_KEY]}],
        "admin": {"keys": [ADMIN_KEY]},
        "state": {"data_dir": str(tmp_path / "data")},
    }
    path = tmp_path / "spillgate.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = serve(path, tmp_path)
    try:
        reduced = copy.deepcopy(current(proc)["config"])
        reduced["hosted_models"] = []
        reduced["routes"] = [route for route in reduced["routes"] if route["name"] != "frontier"]
        assert put(proc, reduced).status_code == 200
        rollback = httpx.post(proc.url + "/admin/config/rollback/1", headers=ADMIN, timeout=30)
        assert rollback.status_code == 200, rollback.text
        assert backend_of(proc, "frontier") == "frontier"
        # Still refused: a simulator this process did not start, or started otherwise.
        changed = copy.deepcopy(current(proc)["config"])
        changed["pools"][0]["simulated"]["count"] = 2
        refused = put(proc, changed)
        assert refused.status_code == 422 and refused.json()["problems"][0]["path"] == "pools.0.simulated"
        # A model litellm cannot place is the operator's mistake: refused here, not blamed on every client.
        changed = copy.deepcopy(current(proc)["config"])
        changed["hosted_models"][0]["model"] = "nosuchprovider/x"
        changed["hosted_models"][0]["api_key"] = "sk-simulated"  # a new model must be sent its key again
        refused = put(proc, changed)
        assert refused.status_code == 422, refused.text
        assert refused.json()["problems"] == [
            {
                "path": "hosted_models.0.model",
                "message": "litellm knows no provider for 'nosuchprovider/x' (e.g. openai/gpt-4o)",
            }
        ]
        # A model litellm can place but has no price for: refused until the config prices it.
        changed["hosted_models"][0]["model"] = "openai/no-such-model"
        changed["hosted_models"][0].update(input_per_mtok=None, output_per_mtok=None)
        refused = put(proc, changed)
        assert refused.status_code == 422, refused.text
        [problem] = refused.json()["problems"]
        assert problem["path"] == "hosted_models.0.model" and "set input_per_mtok" in problem["message"]
        changed["hosted_models"][0].update(input_per_mtok=1, output_per_mtok=2)
        assert put(proc, changed).status_code == 200
    finally:
        proc.stop()


def test_a_yaml_alias_bomb_is_refused_at_once(gateway: tuple[RunningProcess, Path]) -> None:
    proc, _ = gateway
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]  # 10^9 nodes once expanded
    response = httpx.put(
        proc.url + "/admin/config",
        content="\n".join(lines).encode(),
        headers={**ADMIN, "content-type": "application/yaml"},
        timeout=30,
    )
    assert response.status_code == 400 and "aliases" in response.json()["error"]["message"]
    assert pool_of(backend_of(proc)) == "blue"  # and the gateway still serves


@pytest.mark.parametrize(
    ("line", "path"),
    [
        ("  note: !!binary aGVsbG8=", "routes.0.note"),
        ("  note: !!set {a: null}", "routes.0.note"),
        ("  note: !!timestamp 2026-12-03", "routes.0.note"),
        ("  note: 2026-12-03", "routes.0.note"),
        ("  1: one", "routes.0"),
        ("  note: .nan", "routes.0.note"),
    ],
)
def test_yaml_beyond_json_is_refused_by_its_path(gateway: tuple[RunningProcess, Path], line: str, path: str) -> None:
    """Bytes, sets, dates, non-string keys and NaN mean nothing in a config: a 422 naming where, not a 500."""
    proc, _ = gateway
    shown = current(proc)["config"]
    document = yaml.safe_dump(shown).replace("- name: chat\n", "- name: chat\n" + line + "\n", 1)
    assert line in document
    response = httpx.put(
        proc.url + "/admin/config",
        content=document.encode(),
        headers={**ADMIN, "content-type": "application/yaml"},
        timeout=30,
    )
    assert response.status_code == 422, response.text
    assert [p["path"] for p in response.json()["problems"]] == [path]
    assert pool_of(backend_of(proc)) == "blue"
