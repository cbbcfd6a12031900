"""Simulator processes shared by the tests of a module, started on free ports and stopped by PID."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from spillgate.gateway.control.config import RECOMMENDED_SGLANG_FLAGS
from tests.support.procs import RunningProcess, free_port, start_spillgate

StartReplica = Callable[..., RunningProcess]


@pytest.fixture(scope="session")
def start_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartReplica]:
    """Start ``spillgate <command> --port P *args``; every process is stopped when the session ends."""
    log_dir = tmp_path_factory.mktemp("sim")
    started: list[RunningProcess] = []

    def start(command: str, *args: str) -> RunningProcess:
        """Simulated replicas get the recommended flags unless ``--bare`` is the first argument."""
        port = free_port()
        if command == "sim-replica":
            args = args[1:] if args[:1] == ("--bare",) else (*RECOMMENDED_SGLANG_FLAGS, *args)
        vllm = "--engine" in args and args[args.index("--engine") + 1] == "vllm"
        ready = "/ready" if command == "sim-replica" and not vllm else "/health"  # vLLM has no /ready
        proc = start_spillgate([command, "--port", str(port), *args], port=port, log_dir=log_dir, ready_path=ready)
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
