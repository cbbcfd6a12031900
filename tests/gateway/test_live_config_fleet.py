"""Two gateway processes' live configs sharing one Redis and one data directory (``serve --workers 2``): a change
made on one is never lost to a change made at the same time on the other.

Each process here is a :class:`LiveConfig` on a real gateway state, with its own event loop on its own thread and
its own Redis connection. The processes poll Redis for new versions only every hour here, so a change always
lands "between two polls" of the other process: what the fleet then runs cannot depend on polling."""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio as aioredis
import yaml

from spillgate.gateway.control import live_config
from spillgate.gateway.control.config import parse_config
from spillgate.gateway.control.config_history import ConfigVersion
from spillgate.gateway.control.live_config import LiveConfig
from spillgate.gateway.control.replica_edits import ReplicaEditRefused, add_replica
from spillgate.gateway.state import GatewayState, build_state
from tests.support.redis_server import redis_url

T = TypeVar("T")
FIRST = "http://127.0.0.1:7001"
SECOND = "http://127.0.0.1:7002"
THIRD = "http://127.0.0.1:7003"


class GatewayProcess:
    """One process's live config: its gateway state, loop and Redis client are its own; the data directory,
    the config file and Redis are shared."""

    def __init__(self, path: Path, url: str) -> None:
        raw = yaml.safe_load(path.read_text())
        self.state: GatewayState = build_state(parse_config(raw), {}, {}, config_path=path)
        self.live = LiveConfig(self.state, raw, path=path)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.redis = aioredis.from_url(url)
        self.run(self.live.start(self.redis))

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on this process's loop and wait for it (blocking the caller's thread, so a call
        from inside another process's edit lands in the middle of that edit)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)

    def stop(self) -> None:
        self.run(self.live.stop())
        self.run(self.redis.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[GatewayProcess, GatewayProcess, str]]:
    monkeypatch.setattr(live_config, "_REDIS_POLL_S", 3600.0)
    config = {
        "pools": [{"name": "blue", "served_model": "sim-model", "replicas": [FIRST]}],
        "routes": [{"name": "chat", "targets": ["blue"]}],
        "tenants": [{"name": "tenant-a", "keys": ["sk-fleet-tenant"]}],
        "admin": {"keys": ["sk-fleet-admin"]},
        "state": {"data_dir": str(tmp_path / "data"), "key_prefix": "fleet-test"},
    }
    path = tmp_path / "spillgate.yaml"
    path.write_text(yaml.safe_dump(config))
    with redis_url(tmp_path) as url:
        redis.Redis.from_url(url).delete(*(f"fleet-test:config:{key}" for key in ("seq", "current", "versions")))
        one = GatewayProcess(path, url)
        two = GatewayProcess(path, url)
        try:
            yield one, two, url
        finally:
            one.stop()
            two.stop()


def replicas(version: ConfigVersion) -> list[str]:
    [pool] = version.raw["pools"]
    return list(pool["replicas"])


def fleet_version(url: str) -> ConfigVersion:
    """The version every process adopts: the one Redis calls current."""
    client = redis.Redis.from_url(url)
    number = client.get("fleet-test:config:current")
    assert number is not None
    text = client.hget("fleet-test:config:versions", number)
    assert text is not None
    return ConfigVersion.from_json(text.decode())


def add(process: GatewayProcess, url: str) -> ConfigVersion:
    return process.run(process.live.edit(add_replica("blue", url, {}, []), "admin:test"))


def test_an_edit_on_a_process_that_has_not_polled_yet_keeps_the_other_process_edit(
    fleet: tuple[GatewayProcess, GatewayProcess, str],
) -> None:
    one, two, url = fleet
    first = add(one, SECOND)
    second = add(two, THIRD)  # ``two`` still runs the version before ``first``
    assert second.version > first.version
    assert replicas(second) == [FIRST, SECOND, THIRD]
    assert replicas(fleet_version(url)) == [FIRST, SECOND, THIRD]
    assert [r.url for r in two.state.config.pools[0].replicas] == [FIRST, SECOND, THIRD]


def test_a_replica_edit_that_loses_the_race_to_publish_is_made_again_on_the_winner(
    fleet: tuple[GatewayProcess, GatewayProcess, str],
) -> None:
    one, two, url = fleet
    calls: list[list[str]] = []
    edit = add_replica("blue", THIRD, {}, [])

    def racing(raw: dict[str, Any]) -> dict[str, Any]:
        calls.append(list(raw["pools"][0]["replicas"]))
        if len(calls) == 1:  # ``one`` publishes after ``two`` caught up and before ``two`` publishes
            add(one, SECOND)
        return edit(raw)

    version = two.run(two.live.edit(racing, "admin:test"))
    assert calls == [[FIRST], [FIRST, SECOND]], "made again on top of the version that won"
    assert replicas(version) == [FIRST, SECOND, THIRD]
    assert fleet_version(url).version == version.version
    assert replicas(fleet_version(url)) == [FIRST, SECOND, THIRD]


def test_a_whole_config_that_loses_the_race_to_publish_is_refused_with_a_conflict(
    fleet: tuple[GatewayProcess, GatewayProcess, str],
) -> None:
    one, two, url = fleet
    raw = yaml.safe_load(yaml.safe_dump(two.live.current.raw))
    raw["routes"][0]["policy"] = "round_robin"
    build = two.state.catalog_for
    built: list[int] = []

    def racing_build(config: Any) -> Any:
        built.append(1)
        if len(built) == 1:  # ``one`` publishes while ``two`` builds the PUT's catalog
            add(one, SECOND)
        return build(config)

    two.state.catalog_for = racing_build  # type: ignore[method-assign]
    with pytest.raises(ReplicaEditRefused) as refused:
        two.run(two.live.propose(raw, "admin:test"))
    assert (refused.value.status, refused.value.code) == (409, "config_conflict")
    assert "nothing changed" in refused.value.message
    winner = fleet_version(url)
    assert replicas(winner) == [FIRST, SECOND] and winner.raw["routes"][0].get("policy") != "round_robin"
    assert two.live.current.version == winner.version, "the loser runs the winner's version"
    assert [r.url for r in two.state.config.pools[0].replicas] == [FIRST, SECOND]


def test_the_shared_history_file_holds_each_version_once_and_every_process_knows_every_version(
    fleet: tuple[GatewayProcess, GatewayProcess, str],
) -> None:
    one, two, _ = fleet
    add(one, SECOND)
    add(one, THIRD)
    last = two.run(two.live.edit(add_replica("blue", "http://127.0.0.1:7004", {}, []), "admin:test"))
    assert last.version == 4
    [path] = Path(one.state.data_dir).glob("config-history.*.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["history"]["id"] for line in lines[:1]] == [one.live.history_owner()["id"]]
    assert [line["version"] for line in lines[1:]] == [1, 2, 3, 4], "each version once, whoever recorded it"
    assert two.live.history_owner() == one.live.history_owner()
    assert [v.version for v in two.live.history()] == [1, 2, 3, 4]
    skipped = two.live.version(2)  # ``two`` went from version 1 to 3: version 2 is still there to roll back to
    assert skipped is not None and replicas(skipped) == [FIRST, SECOND]


def test_a_replica_removed_on_one_process_renames_no_other_on_any_process_old_or_new(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first of three replicas removed by a whole-config edit on one process: the others keep their names and
    what was learned of them there, on the process that follows the fleet, and a process started afterwards on
    the latest version names them the same (state in Redis is keyed by those names)."""
    monkeypatch.setattr(live_config, "_REDIS_POLL_S", 0.05)
    config = {
        "pools": [{"name": "blue", "served_model": "sim-model", "replicas": [FIRST, SECOND, THIRD]}],
        "routes": [{"name": "chat", "targets": ["blue"]}],
        "admin": {"keys": ["sk-fleet-admin"]},
        "auth": {"required": False},
        "state": {"data_dir": str(tmp_path / "data"), "key_prefix": "fleet-names"},
    }
    path = tmp_path / "spillgate.yaml"
    path.write_text(yaml.safe_dump(config))
    kept = {SECOND: "blue/127.0.0.1:7002", THIRD: "blue/127.0.0.1:7003"}
    with redis_url(tmp_path) as url:
        redis.Redis.from_url(url).delete(*(f"fleet-names:config:{key}" for key in ("seq", "current", "versions")))
        processes = [GatewayProcess(path, url), GatewayProcess(path, url)]
        try:
            one, two = processes
            learned = {}
            for process in processes:
                assert names(process) == {FIRST: "blue/127.0.0.1:7001", **kept}
                backends = {b.base_url: b for b in process.state.registry}
                backends[SECOND].ttft_s = 0.25  # a measured TTFT
                process.state.prefix.index.insert(kept[THIRD], [7, 8, 9])  # a prefix the third replica holds
                learned[process] = backends
            edited = copy.deepcopy(one.live.current.raw)
            edited["pools"][0]["replicas"] = [SECOND, THIRD]
            version = one.run(one.live.propose(edited, "admin:test"))
            deadline = time.monotonic() + 10
            while two.live.current.version != version.version:
                assert time.monotonic() < deadline, "the other process never ran the edit"
                time.sleep(0.05)
            for process in processes:
                assert names(process) == kept
                backends = {b.base_url: b for b in process.state.registry}
                assert all(backends[u] is learned[process][u] for u in kept), "the same backends, not new ones"
                assert backends[SECOND].ttft_s == 0.25
                assert process.state.prefix.index.match([7, 8, 9], [kept[THIRD]]) == {kept[THIRD]: 3}
            processes.append(GatewayProcess(path, url))  # starts on the file, adopts the fleet's version
            assert processes[-1].live.current.version == version.version
            assert names(processes[-1]) == kept
        finally:
            for process in processes:
                process.stop()


def names(process: GatewayProcess) -> dict[str, str]:
    """Each replica's name on ``process``, by its URL."""
    return {backend.base_url: backend.name for backend in process.state.registry}
