"""Child processes the embedded default needs: simulated replicas and hosted models on free ports."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

import httpx

_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """Runs in the child before exec: if the gateway is killed outright, its simulators go too."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ChildProcesses:
    """Starts ``spillgate`` subcommands as children and stops them by PID."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._host = host
        self._children: list[subprocess.Popen[bytes]] = []

    def start(self, command: str, args: Sequence[str]) -> str:
        """Start ``spillgate COMMAND --port <free> ARGS`` and return its base URL (not yet waited for)."""
        port = free_port(self._host)
        child = subprocess.Popen(
            [sys.executable, "-m", "spillgate.gateway.cli", command, "--host", self._host, "--port", str(port), *args],
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self._children.append(child)
        return f"http://{self._host}:{port}"

    def wait_ready(self, urls: Sequence[str], timeout_s: float = 30.0) -> None:
        """Block until every URL (a child's readiness check) answers 200; raise if a child dies or time runs out."""
        deadline = time.monotonic() + timeout_s
        pending = list(urls)
        while pending:
            for child in self._children:
                if child.poll() is not None:
                    raise RuntimeError(f"simulator (pid {child.pid}) exited with code {child.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"simulators not ready after {timeout_s}s: {pending}")
            pending = [url for url in pending if not _answers(url)]
            if pending:
                time.sleep(0.05)

    def stop_all(self, timeout_s: float = 5.0) -> None:
        for child in self._children:
            _signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in self._children:
            try:
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(child, signal.SIGKILL)
                child.wait()
        self._children.clear()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def _signal_group(child: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signum)
