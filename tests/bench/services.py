"""Servers the benchmark starts, each pinned to one core and stopped by the PID it was started with.

Never by name: sglang-router renames its process, and other engineers' gateways may run on the machine.
Each server gets its own session, so a Ctrl-C at the terminal reaches only the benchmark, which then stops
them in its ``finally``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Service:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM to the process group this PID leads, then SIGKILL if it will not go."""
        if not self.running():
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.popen.wait(timeout=timeout)


def start_pinned(name: str, argv: Sequence[str], *, cpu: int | str, log_dir: Path) -> Service:
    """Run ``argv`` under ``taskset -c cpu`` (which execs it, so the PID is the server's) from the repo root;
    ``cpu`` a core, or a ``taskset`` list of them (``"0,1"``)."""
    log_path = log_dir / f"{name}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            ["taskset", "-c", str(cpu), *argv],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return Service(name, popen, log_path)


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 only: ignore *_proxy


def http_request(url: str, *, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """Status and body of one GET (or POST when ``body`` is given); status 0 when nothing answered."""
    request = urllib.request.Request(url, data=body, headers=headers or {}, method="POST" if body else "GET")
    try:
        with _OPENER.open(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def wait_until(service: Service, ready: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Poll ``ready`` until it holds; fail early, with the server's log, if the server exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service.running():
            raise RuntimeError(f"{service.name} exited ({service.popen.returncode}):\n{service.log_tail()}")
        if ready():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{service.name}: {what} not within {timeout:g}s:\n{service.log_tail()}")


def run_script(name: str, run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a benchmark script's ``run``: its exit status, or 130 when interrupted and 1 on a setup error, each
    said in one line (whatever it started is stopped by then)."""
    try:
        return run(args)
    except KeyboardInterrupt:
        print("interrupted: every process started was stopped", file=sys.stderr)
        return 130
    except (RuntimeError, ValueError) as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 1
