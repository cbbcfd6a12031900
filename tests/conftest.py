"""Fixtures shared by the whole suite: real processes on 127.0.0.1, stopped by PID."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.gateway import gateway_config, start_gateway, start_replica
from tests.support.procs import RunningProcess
from tests.support.redis_server import redis_url as private_redis

FAST = ("--time-scale", "0.02")


@pytest.fixture(scope="session")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RunningProcess]]:
    """Three simulated replicas shared by the tests that do not stop them."""
    log_dir = tmp_path_factory.mktemp("replicas")
    started: list[RunningProcess] = []
    try:
        for _ in range(3):
            started.append(start_replica(log_dir, *FAST))
        yield started
    finally:
        for proc in started:
            proc.stop()


@pytest.fixture(scope="session")
def gateway(replicas: list[RunningProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    """A gateway over the shared replicas."""
    proc = start_gateway(gateway_config([r.url for r in replicas]), tmp_path_factory.mktemp("gateway"))
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Redis: ``REDIS_URL`` when set, else a private redis-server stopped by PID at the end."""
    with private_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url
