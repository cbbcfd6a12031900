"""A Redis for tests: ``REDIS_URL`` when set, else a private ``redis-server`` on a free port."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from spillgate.gateway.supervisor import redis_server_argv
from tests.support.procs import free_port


@contextmanager
def redis_url(work_dir: Path, *, port: int | None = None) -> Iterator[str]:
    """Yield a Redis URL; with ``port`` always a private server on that port (for outage tests)."""
    given = os.environ.get("REDIS_URL")
    if given and port is None:
        yield given
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed and REDIS_URL is not set (make test installs it)")
    port = port or free_port()
    proc = subprocess.Popen(
        redis_server_argv(binary, port, str(work_dir)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
