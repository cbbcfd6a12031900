"""Child processes the embedded default needs (simulated replicas and hosted models on free ports, a private
Redis for several gateway processes), and the listening socket, bound before any of them starts."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import httpx

_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


LISTEN_BACKLOG = 2048
"""Connections the kernel queues before a gateway process accepts them (uvicorn's default)."""


class CannotListen(Exception):
    """The address the gateway is to listen on cannot be bound; the message says how to choose another."""


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` and listening, inheritable by worker processes: bound first, so that a
    port in use stops the gateway before it starts anything else."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart binds despite TIME_WAIT
    try:
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise CannotListen(
                f"port {port} on {host} is already in use; choose another with --port (or listen.port in the config)"
            ) from None
        raise CannotListen(f"cannot listen on {host}:{port} ({exc.strerror}); check --host and --port") from None
    sock.set_inheritable(True)
    return sock


def die_with_parent() -> None:
    """Runs in the child before exec: if the gateway is killed outright, its simulators go too."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ChildProcesses:
    """Starts ``spillgate`` subcommands as children and stops them by PID."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._host = host
        self._children: list[subprocess.Popen[bytes]] = []
        self.readiness: list[str] = []
        """The URLs that answer 200 once the children started so far serve (for :meth:`wait_ready`)."""

    def start(self, command: str, args: Sequence[str]) -> str:
        """Start ``spillgate COMMAND --port <free> ARGS`` and return its base URL (not yet waited for)."""
        port = free_port(self._host)
        child = subprocess.Popen(
            [sys.executable, "-m", "spillgate.gateway.cli", command, "--host", self._host, "--port", str(port), *args],
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
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


class PrivateRedis:
    """A ``redis-server`` of the gateway's own, without persistence, stopped by PID.

    It listens on no TCP port, only on a unix socket inside a directory of its own (mode 0700): the workers'
    shared state (budgets, config versions with their admin key digests) must not be writable by any other local
    user, and the directory's mode is what keeps them out, without a password to hand around. Its budgets and rate
    limits start empty at every start; each gateway process puts back what its ledger holds (the epoch rejoin of
    ``gateway.accounting.rebuild``), as after any Redis that comes back empty."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None
        self.socket_path = ""
        self.url = ""

    @staticmethod
    def available() -> bool:
        return shutil.which("redis-server") is not None

    def start(self, timeout_s: float = 10.0) -> str:
        """Start it and return its ``unix://`` URL once it answers."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self._dir = _private_dir()
        self.socket_path = os.path.join(self._dir, "redis.sock")
        self._proc = subprocess.Popen(
            private_redis_argv(binary, self.socket_path, self._dir),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )
        self.url = f"unix://{self.socket_path}"
        deadline = time.monotonic() + timeout_s
        while not _pings(self.socket_path):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the private redis-server on {self.url} did not start")
            time.sleep(0.05)
        return self.url

    def stop(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


_MAX_SOCKET_PATH = 100
"""A unix socket's path must fit ``sun_path`` (108 bytes on Linux, 104 on macOS), with room to spare."""


def _private_dir() -> str:
    """A new directory only this user can enter (``mkdtemp`` makes it 0700), short enough for a socket path: in
    ``$TMPDIR``, else ``/tmp`` when that is too deep."""
    work_dir = tempfile.mkdtemp(prefix="spillgate-redis-")
    if len(os.path.join(work_dir, "redis.sock")) > _MAX_SOCKET_PATH:
        os.rmdir(work_dir)
        work_dir = tempfile.mkdtemp(prefix="spillgate-redis-", dir="/tmp")
    os.chmod(work_dir, 0o700)  # whatever the umask: the mode is the private Redis's only lock
    return work_dir


def _pings(socket_path: str) -> bool:
    """Whether a Redis answers PING on ``socket_path`` (RESP by hand: no client library in the parent process)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(0.5)
            conn.connect(socket_path)
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def redis_server_argv(binary: str, port: int, work_dir: str) -> list[str]:
    """A ``redis-server`` on 127.0.0.1 that writes nothing to disk: what it holds is rebuilt from the ledgers.
    Without a password: for tests, and as the base of :func:`private_redis_argv`, which takes TCP away."""
    return [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", work_dir]


def private_redis_argv(binary: str, socket_path: str, work_dir: str) -> list[str]:
    """The gateway's own ``redis-server``: no TCP port (``--port 0``), only a unix socket that only its owner may
    open, in a directory only its owner may enter."""
    return [*redis_server_argv(binary, 0, work_dir), "--unixsocket", socket_path, "--unixsocketperm", "700"]
