"""One truth for the running config: the file and the admin API never silently undo each other, an accepted edit
survives a restart, each config keeps its own history, a refused edit lists every problem of every check, and
every change is logged where operators look (the default level, warning)."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.gateway.test_live_config import (
    ADMIN,
    TENANT,
    backend_of,
    base_config,
    current,
    eventually,
    put,
    serve,
)
from tests.support.gateway import TENANT_KEY, pool_of, replica_name, running_replicas, start_replica
from tests.support.procs import RunningProcess, free_port


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RunningProcess]]:
    """Two replicas of this module's own: ``blue`` and ``green`` in :func:`base_config`."""
    yield from running_replicas(tmp_path_factory.mktemp("truth-replicas"), 2, "--time-scale", "0.05")


def both_in_blue(replicas: list[RunningProcess]) -> set[str]:
    """The backends once the second replica has joined blue too: its name there and in green differ."""
    return {replica_name(replicas[0], "blue"), replica_name(replicas[1], "blue"), replica_name(replicas[1], "green")}


def health(gateway: RunningProcess) -> dict[str, Any]:
    response = httpx.get(gateway.url + "/health")
    assert response.status_code == 200, response.text
    return response.json()


def save(path: Path, config: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(config))


@contextmanager
def serving(path: Path, log_dir: Path, port: int | None = None) -> Iterator[RunningProcess]:
    """A gateway on the config file ``path``, stopped when the block ends."""
    proc = serve(path, log_dir, port)
    try:
        yield proc
    finally:
        proc.stop()


def saved_config(replicas: list[RunningProcess], tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """The base config saved as the file a gateway starts with, and that config for the test to change and save."""
    path = tmp_path / "spillgate.yaml"
    config = base_config(replicas, tmp_path / "data")
    save(path, config)
    return path, config


def two_configs(replicas: list[RunningProcess], tmp_path: Path) -> tuple[Path, Path, Path]:
    """The shared data directory and two config files keeping their state there: ``one`` routes to blue,
    ``two`` to green."""
    data = tmp_path / "data"
    one, two = tmp_path / "one.yaml", tmp_path / "two.yaml"
    save(one, base_config(replicas, data))
    other = base_config(replicas, data)
    other["routes"][0]["targets"] = ["green"]
    save(two, other)
    return data, one, two


def switch_to_round_robin(path: Path, log_dir: Path) -> None:
    """Run a gateway on ``path`` just long enough to switch its route to round_robin through the admin API, as
    version 2."""
    with serving(path, log_dir) as proc:
        edited = current(proc)["config"]
        edited["routes"][0]["policy"] = "round_robin"
        assert put(proc, edited).json()["version"] == 2


def config_history(gateway: RunningProcess) -> dict[str, Any]:
    response = httpx.get(gateway.url + "/admin/config/history", headers=ADMIN)
    assert response.status_code == 200, response.text
    return response.json()


def warning_lines(gateway: RunningProcess, text: str) -> list[str]:
    """The gateway's log lines holding ``text``, each checked to be at WARNING or above."""
    lines = [line for line in gateway.log().splitlines() if text in line]
    for line in lines:
        assert "WARNING" in line or "ERROR" in line, line
    return lines


def test_an_api_edit_is_not_undone_by_an_unrelated_file_save(replicas: list[RunningProcess], tmp_path: Path) -> None:
    path, config = saved_config(replicas, tmp_path)
    with serving(path, tmp_path) as proc:
        edited = current(proc)["config"]
        edited["pools"][0]["replicas"].append(replicas[1].url)  # a replica added through the API
        assert put(proc, edited).json()["version"] == 2
        assert set(health(proc)["backends"]) == both_in_blue(replicas)
        assert current(proc)["file"]["not_in_file"] == [f"pools.0.replicas.1: added {replicas[1].url!r}"]
        path.write_text(path.read_text() + "# a comment changes nothing\n")
        time.sleep(1.5)  # the file is polled every second
        assert current(proc)["version"] == 2 and current(proc)["warnings"] == []

        config["routes"][0]["aliases"] = ["assistant"]  # an unrelated change saved to the file
        save(path, config)
        eventually(lambda: bool(current(proc)["warnings"]))
        shown = current(proc)
        assert shown["version"] == 2, "the file was not applied"
        assert shown["file"]["not_applied"]["would_undo"] == ["pools.0.replicas.1"]
        assert set(health(proc)["backends"]) == both_in_blue(replicas), "the API's replica stays"
        [warning] = health(proc)["config_warnings"]
        assert "would undo 1 change(s)" in warning and "pools.0.replicas.1" in warning
        assert replicas[1].url not in warning, "/health needs no key: paths only, no values"
        assert warning_lines(proc, "would undo 1 change(s)")

        # The operator takes the edit into the file: it applies, with the unrelated change, and nothing is lost.
        config["pools"][0]["replicas"].append(replicas[1].url)
        save(path, config)
        eventually(lambda: current(proc)["version"] == 3)
        shown = current(proc)
        assert shown["file"]["in_sync"] and shown["warnings"] == [] and health(proc)["config_warnings"] == []
        assert set(health(proc)["backends"]) == both_in_blue(replicas)
        assert pool_of(backend_of(proc, "assistant")) == "blue"


def test_the_file_wins_when_an_admin_says_so(replicas: list[RunningProcess], tmp_path: Path) -> None:
    path, config = saved_config(replicas, tmp_path)
    with serving(path, tmp_path) as proc:
        edited = current(proc)["config"]
        edited["routes"][0]["targets"] = ["green"]
        assert put(proc, edited).status_code == 200
        config["routes"][0]["aliases"] = ["assistant"]
        save(path, config)
        eventually(lambda: bool(current(proc)["warnings"]))
        assert pool_of(backend_of(proc)) == "green"

        assert httpx.post(proc.url + "/admin/config/reload", headers=TENANT).status_code == 403
        reloaded = httpx.post(proc.url + "/admin/config/reload", headers=ADMIN, timeout=30)
        assert reloaded.status_code == 200, reloaded.text
        assert reloaded.json()["version"] == 3
        assert set(reloaded.json()["diff"]) == {
            "routes.0.targets.0: 'green' -> 'blue'",
            "routes.0.aliases.0: added 'assistant'",
        }, "the undone edit is in the version's diff"
        assert pool_of(backend_of(proc, "assistant")) == "blue"
        shown = current(proc)
        assert shown["file"]["in_sync"] and shown["warnings"] == []
        assert warning_lines(proc, "config version 3 applied from the config file")
        history = config_history(proc)
        assert history["versions"][-1]["author"].startswith("file (reloaded by admin:")


def test_an_accepted_api_edit_survives_restarts(replicas: list[RunningProcess], tmp_path: Path) -> None:
    path, config = saved_config(replicas, tmp_path)
    port = free_port()
    with serving(path, tmp_path, port) as proc:
        edited = current(proc)["config"]
        edited["pools"][0]["replicas"].append(replicas[1].url)
        assert put(proc, edited).json()["version"] == 2

    config["routes"][0]["aliases"] = ["assistant"]  # the file changes while the gateway is stopped
    save(path, config)
    for _ in range(2):  # and a second restart, with nothing changed, keeps it alike
        with serving(path, tmp_path, port) as proc:
            shown = current(proc)
            assert shown["version"] == 2, "the edit the file lacks keeps running"
            assert shown["config"]["pools"][0]["replicas"] == [replicas[0].url, replicas[1].url]
            assert set(health(proc)["backends"]) == both_in_blue(replicas)
            assert shown["file"]["not_applied"]["would_undo"] == ["pools.0.replicas.1"]
            assert "would undo 1 change(s)" in health(proc)["config_warnings"][0]
            assert warning_lines(proc, "would undo 1 change(s)")

    config["pools"][0]["replicas"].append(replicas[1].url)  # the file takes the edit in while stopped
    save(path, config)
    with serving(path, tmp_path, port) as proc:
        shown = current(proc)
        assert shown["version"] == 3 and shown["file"]["in_sync"] and shown["warnings"] == []
        assert set(health(proc)["backends"]) == both_in_blue(replicas)
        assert pool_of(backend_of(proc, "assistant")) == "blue"
        assert warning_lines(proc, "config version 3 applied from the config file")


def test_two_configs_in_one_data_directory_keep_separate_histories(
    replicas: list[RunningProcess], tmp_path: Path
) -> None:
    data, one, two = two_configs(replicas, tmp_path)
    switch_to_round_robin(one, tmp_path)
    with serving(two, tmp_path) as proc:
        history = config_history(proc)
        assert [v["version"] for v in history["versions"]] == [1] and history["current"] == 1
        assert history["history"]["config"] == str(two)
        assert pool_of(backend_of(proc)) == "green" and current(proc)["config"]["routes"][0]["policy"] == "least_load"
    with serving(one, tmp_path) as proc:
        history = config_history(proc)
        assert [v["version"] for v in history["versions"]] == [1, 2], "its own versions, the edit included"
        assert history["history"]["config"] == str(one)
        assert current(proc)["config"]["routes"][0]["policy"] == "round_robin"
    files = sorted(p.name for p in data.glob("config-history*"))
    assert len(files) == 2 and all(name.startswith(("config-history.one.", "config-history.two.")) for name in files)
    for name in files:
        owner = json.loads((data / name).read_text().splitlines()[0])["history"]
        assert owner["config"] == str(one if ".one." in name else two) and owner["id"]


def test_a_history_from_before_owners_is_adopted_only_by_its_config(
    replicas: list[RunningProcess], tmp_path: Path
) -> None:
    data, one, two = two_configs(replicas, tmp_path)
    switch_to_round_robin(one, tmp_path)
    # Made into a history as the gateway wrote them before histories had owners: one file, no owner line.
    [own] = data.glob("config-history.one.*.jsonl")
    legacy = data / "config-history.jsonl"
    legacy.write_text("\n".join(own.read_text().splitlines()[1:]) + "\n")
    own.unlink()

    with serving(two, tmp_path) as proc:  # another config's versions: left alone
        assert current(proc)["version"] == 1 and pool_of(backend_of(proc)) == "green"
        assert legacy.exists()
    with serving(one, tmp_path) as proc:  # the config the history last saw: adopted, its edit kept
        shown = current(proc)
        assert shown["version"] == 2 and shown["config"]["routes"][0]["policy"] == "round_robin"
        assert not legacy.exists()
        history = config_history(proc)
        assert [v["version"] for v in history["versions"]] == [1, 2]


def test_a_refused_edit_lists_the_problems_of_every_check(replicas: list[RunningProcess], tmp_path: Path) -> None:
    path, _ = saved_config(replicas, tmp_path)
    with serving(path, tmp_path) as proc:
        before = current(proc)
        config = copy.deepcopy(before["config"])
        config["limits"] = {"max_tokens": -5}  # the schema
        config["routes"][0]["targets"] = ["blue", "purple"]  # a cross-reference
        config["pools"][1]["replicas"] = ["http://10.9.8.7:30000"]  # a host the config at start does not use
        config["tenants"][0]["keys"].append("os.environ/HOME")  # a variable the config at start does not name
        config["timeouts"] = {"read_s": 5}  # a start-up setting
        response = put(proc, config)
        assert response.status_code == 422, response.text
        body = response.json()
        problems = {p["path"]: p["message"] for p in body["problems"]}
        assert set(problems) == {
            "limits.max_tokens",
            "routes.0.targets.1",
            "pools.1.replicas.0",
            "tenants.0.keys.1",
            "timeouts",
        }, body["problems"]
        assert "greater than 0" in problems["limits.max_tokens"]
        assert "unknown target 'purple'" in problems["routes.0.targets.1"]
        assert "upstream_hosts" in problems["pools.1.replicas.0"]
        assert "secrets.env" in problems["tenants.0.keys.1"]
        assert "restart" in problems["timeouts"]
        error = body["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "invalid_config"
        assert error["message"].startswith("The config was refused (5 problem(s))")
        assert error["param"] == body["problems"][0]["path"]
        assert current(proc) == before

        # An entry the schema cannot read stands in by its name: names resolving to it are not reported, other
        # names are, and nothing in the entry is made up.
        config = copy.deepcopy(before["config"])
        config["routes"][0]["targets"] = ["green"]
        config["pools"][1]["replicas"] = ["http://127.0.0.1:1/with/a/path"]
        config["tenants"][0]["routes"] = ["chat", "nope"]
        problems = {p["path"]: p["message"] for p in put(proc, config).json()["problems"]}
        assert set(problems) == {"pools.1.replicas.0", "tenants.0.routes.1"}, problems
        assert problems["tenants.0.routes.1"] == "tenant 'tenant-a' names unknown route 'nope'"
        assert pool_of(backend_of(proc)) == "blue"


def test_config_changes_are_logged_at_the_default_level_without_secrets(
    replicas: list[RunningProcess], tmp_path: Path
) -> None:
    path, config = saved_config(replicas, tmp_path)
    with serving(path, tmp_path) as proc:  # no --log-level: warning
        edited = current(proc)["config"]
        edited["routes"][0]["policy"] = "round_robin"
        edited["tenants"][0]["keys"].append("sk-a-brand-new-tenant-key")
        assert put(proc, edited).json()["version"] == 2
        [applied] = warning_lines(proc, "config version 2 applied from the admin API (admin:")
        assert "2 change(s)" in applied and "routes.0.policy changed" in applied
        assert "tenants.0.keys.1 added" in applied

        edited["limits"] = {"max_tokens": 0}
        assert put(proc, edited).status_code == 422
        [refused] = warning_lines(proc, "config change from the admin API")
        assert "refused" in refused and "limits.max_tokens" in refused

        config["routes"][0]["policy"] = "round_robin"
        config["tenants"][0]["keys"].append("sk-a-brand-new-tenant-key")
        config["routes"][0]["aliases"] = ["assistant"]
        save(path, config)
        eventually(lambda: current(proc)["version"] == 3)
        [from_file] = warning_lines(proc, "config version 3 applied from the config file")
        assert "1 change(s): routes.0.aliases.0 added" in from_file

        save(path, {**config, "limits": {"max_tokens": -1}})
        eventually(lambda: bool(current(proc)["warnings"]))
        time.sleep(0.2)
        assert warning_lines(proc, "config change from the config file")
        log = proc.log()
        assert "sk-a-brand-new-tenant-key" not in log and TENANT_KEY not in log


def test_a_key_sent_through_the_api_survives_a_restart(replicas: list[RunningProcess], tmp_path: Path) -> None:
    key = "sk-sent-through-the-admin-api"
    keyed = start_replica(tmp_path, "--time-scale", "0.05", "--api-key", key)
    path, _ = saved_config(replicas, tmp_path)
    data = tmp_path / "data"
    port = free_port()
    try:
        with serving(path, tmp_path, port) as proc:
            edited = current(proc)["config"]
            pool = {"name": "keyed", "served_model": "sim-model", "replicas": [keyed.url], "api_key": key}
            edited["pools"].append(pool)
            edited["routes"].append({"name": "keyed", "targets": ["keyed"]})
            assert put(proc, edited).status_code == 200
            assert backend_of(proc, "keyed") == replica_name(keyed, "keyed")
        [history] = data.glob("config-history.*.jsonl")
        [secrets] = data.glob("config-secrets.*.json")
        assert key not in history.read_text(), "versions are stored without secrets"
        assert key in secrets.read_text() and secrets.stat().st_mode & 0o077 == 0

        with serving(path, tmp_path, port) as proc:
            assert current(proc)["version"] == 2 and current(proc)["warnings"] == []
            assert backend_of(proc, "keyed") == replica_name(keyed, "keyed"), "the replica still gets the key"

        secrets.unlink()  # the key is gone: the version cannot run, and the file runs instead, loudly
        with serving(path, tmp_path, port) as proc:
            shown = current(proc)
            assert shown["version"] == 3 and [p["name"] for p in shown["config"]["pools"]] == ["blue", "green"]
            [warning] = health(proc)["config_warnings"]
            assert "config version 2 could not be restored" in warning and "pools.2.api_key" in warning
            assert warning_lines(proc, "config version 2 could not be restored")
            history = config_history(proc)
            assert [v["version"] for v in history["versions"]] == [1, 2, 3], "version 2 stays in the history"
    finally:
        keyed.stop()
