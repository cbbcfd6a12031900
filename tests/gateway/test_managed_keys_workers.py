"""Managed keys under ``serve --workers 2``: the workers share them through the private Redis the parent runs,
and that Redis ending with the gateway loses none of them (the data directory's copy brings them back)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.gateway.test_managed_keys import admin, create, keys_config, refused_as_unknown, status_of
from tests.support.gateway import start_replica
from tests.support.procs import RunningProcess, free_port, start_spillgate

TRIES = 16
"""Requests on new connections, each taken by whichever worker accepts it first."""


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    proc = start_replica(tmp_path_factory.mktemp("workers-keys-replica"), "--time-scale", "0.01")
    yield proc
    proc.stop()


def start_workers(replica: RunningProcess, tmp_path: Path) -> RunningProcess:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    path = tmp_path / "workers.yaml"
    path.write_text(yaml.safe_dump(keys_config(replica, tmp_path / "data")))
    command = ["serve", "--config", str(path), "--port", str(port), "--workers", "2"]
    return start_spillgate(command, port=port, log_dir=tmp_path, ready_path="/ready", timeout=120)


def test_workers_share_managed_keys_and_keep_them_across_a_restart(replica: RunningProcess, tmp_path: Path) -> None:
    gateway = start_workers(replica, tmp_path)
    try:
        kept = create(gateway)
        gone = create(gateway)
        assert [status_of(gateway, kept["key"]) for _ in range(TRIES)] == [200] * TRIES
        assert admin(gateway, "DELETE", f"/admin/keys/{gone['id']}").status_code == 200
        assert [status_of(gateway, gone["key"]) for _ in range(TRIES)] == [401] * TRIES
    finally:
        gateway.stop(timeout=60)
    gateway = start_workers(replica, tmp_path)
    try:
        assert [status_of(gateway, kept["key"]) for _ in range(TRIES)] == [200] * TRIES
        refused_as_unknown(gateway, gone["key"])
    finally:
        gateway.stop(timeout=60)
