"""Throughput with wrk: a Python load generator saturates its own core long before a fast relay does.

wrk counts a chunked (streamed) response once it has read the terminating chunk, so its requests/s on a
streaming request is streams/s.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


class WrkMissing(RuntimeError):
    """wrk is not installed and could not be installed."""


@dataclass
class WrkResult:
    connections: int
    seconds: float
    requests: int
    per_second: float
    p50_ms: float
    p99_ms: float
    non_2xx: int
    socket_errors: int


def ensure_wrk() -> str:
    """The path of wrk, installing the Debian package when running as root; else say how to get it."""
    found = shutil.which("wrk")
    if found:
        return found
    if os.geteuid() != 0:
        raise WrkMissing("wrk is not installed: run `sudo apt-get install -y wrk` (Debian/Ubuntu) and retry")
    print("wrk is missing: installing the Debian package (apt-get install -y wrk) ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "wrk"]
    if subprocess.run(install, env=env, capture_output=True, timeout=300).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=300)
        subprocess.run(install, env=env, capture_output=True, timeout=300)
    found = shutil.which("wrk")
    if not found:
        raise WrkMissing("wrk is not installed and `apt-get install -y wrk` did not provide it")
    return found


def run_wrk(wrk: str, url: str, script: Path, *, connections: int, seconds: float, cpu: int) -> WrkResult:
    """One wrk run with one thread, pinned to ``cpu``."""
    duration = max(1, round(seconds))
    command = ["taskset", "-c", str(cpu), wrk, "-t1", f"-c{connections}", f"-d{duration}s", "--latency"]
    done = subprocess.run(
        [*command, "-s", str(script), url], capture_output=True, text=True, timeout=duration + 30, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return parse_wrk(done.stdout, connections, duration)


def parse_wrk(output: str, connections: int, seconds: float) -> WrkResult:
    requests = re.search(r"(\d+) requests in", output)
    per_second = re.search(r"Requests/sec:\s+([\d.]+)", output)
    if requests is None or per_second is None:
        raise RuntimeError(f"cannot read wrk's output:\n{output}")
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    return WrkResult(
        connections=connections,
        seconds=seconds,
        requests=int(requests.group(1)),
        per_second=float(per_second.group(1)),
        p50_ms=_latency_ms(output, "50%"),
        p99_ms=_latency_ms(output, "99%"),
        non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
        socket_errors=sum(int(n) for n in errors.groups()) if errors else 0,
    )


def _latency_ms(output: str, label: str) -> float:
    found = re.search(rf"^\s+{re.escape(label)}\s+([\d.]+)(us|ms|s|m)\s*$", output, re.MULTILINE)
    return round(float(found.group(1)) * _UNITS_MS[found.group(2)], 3) if found else float("nan")
