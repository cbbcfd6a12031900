"""Simulator processes shared by the tests of a module, started on free ports and stopped by PID."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.support.procs import RunningProcess, free_port, start_spillgate

StartReplica = Callable[..., RunningProcess]


@pytest.fixture(scope="session")
def start_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartReplica]:
    """Start ``spillgate <command> --port P *args``; every process is stopped when the session ends."""
    log_dir = tmp_path_factory.mktemp("sim")
    started: list[RunningProcess] = []

    def start(command: str, *args: str) -> RunningProcess:
        port = free_port()
        proc = start_spillgate([command, "--port", str(port), *args], port=port, log_dir=log_dir)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture(scope="session")
def replica(start_sim: StartReplica) -> RunningProcess:
    """A Llama-3.1-8B-on-H100 replica running 20x faster than real time."""
    return start_sim("sim-replica", "--time-scale", "0.05")


@pytest.fixture
def client(replica: RunningProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=replica.url, timeout=30.0) as http:
        yield http
