"""Start the real processes a test needs (simulators, gateways) on 127.0.0.1 and stop them by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """Ask the kernel for a free TCP port on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports: a data-parallel engine binds rank r at base + r."""
    while True:
        base = free_port()
        try:
            for port in range(base + 1, base + count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base


@dataclass
class RunningProcess:
    """A child process serving HTTP on ``url``; stop it with :meth:`stop`."""

    popen: subprocess.Popen[bytes]
    url: str
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the process group by PID: SIGTERM, then SIGKILL if it will not go."""
        if self.popen.poll() is not None:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=timeout)


def start_spillgate(
    args: Sequence[str],
    *,
    port: int,
    log_dir: Path,
    ready_path: str = "/health",
    timeout: float = 30.0,
    env: dict[str, str] | None = None,
) -> RunningProcess:
    """Run ``spillgate ARGS`` in its own process group and wait until ``ready_path`` answers 200."""
    command = [sys.executable, "-m", "spillgate.gateway.cli", *args]
    return start_process(command, port=port, log_dir=log_dir, ready_path=ready_path, timeout=timeout, env=env)


def start_process(
    command: Sequence[str],
    *,
    port: int,
    log_dir: Path,
    ready_path: str,
    timeout: float,
    env: dict[str, str] | None = None,
    name: str = "spillgate",
    cwd: Path = REPO_ROOT,
) -> RunningProcess:
    """Run ``command`` in its own process group, its output in ``log_dir``, and wait until it serves
    ``ready_path`` on ``port``; stopped (by PID) if it does not."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}-{port}.log"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log_path.open("wb") as log_file:
        popen = subprocess.Popen(
            list(command), cwd=cwd, stdout=log_file, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
        )
    proc = RunningProcess(popen=popen, url=f"http://127.0.0.1:{port}", log_path=log_path)
    try:
        wait_until_ready(proc, ready_path, timeout)
    except BaseException:
        proc.stop()
        raise
    return proc


def wait_until_ready(proc: RunningProcess, path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"process exited with {proc.popen.returncode}:\n{proc.log()}")
        try:
            if httpx.get(proc.url + path, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{proc.url}{path} not ready after {timeout}s:\n{proc.log()[-5000:]}")
