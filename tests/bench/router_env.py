"""Finding a Python that can run sglang-router 0.3.2, installing it into a cached venv of its own if need be;
the same for Shepherd Model Gateway (``smg`` on PyPI, a Rust binary in a Python wheel), pinned to the version
first measured.

Their own venvs, not the project's: the routers pull in their own fastapi/uvicorn/aiohttp/setproctitle/grpcio
pins, and the comparison should never change what the gateway runs on. Installed once, then reused.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROUTER_PACKAGE = "sglang-router"
ROUTER_VERSION = "0.3.2"
SMG_PACKAGE = "smg"
SMG_VERSION = "1.13.0"
_INSTALL_TIMEOUT_S = 600


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "spillgate-bench" / f"sglang-router-{ROUTER_VERSION}"


def installed_version(python: str) -> str | None:
    """The sglang-router version ``python`` can import (``setproctitle`` too, which it needs), or None."""
    probe = "import importlib.metadata as m, setproctitle, sglang_router; print(m.version('sglang-router'))"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def router_python() -> tuple[str | None, str]:
    """(python, note) for a Python that runs the router, or (None, why the router row must be skipped)."""
    if installed_version(sys.executable) == ROUTER_VERSION:
        return sys.executable, "sglang-router from the current environment"
    venv = cache_dir()
    python = str(venv / "bin" / "python")
    if Path(python).exists() and installed_version(python) == ROUTER_VERSION:
        return python, f"sglang-router from {venv}"
    print(f"installing {ROUTER_PACKAGE}=={ROUTER_VERSION} into {venv} (once) ...", flush=True)
    try:
        _run([sys.executable, "-m", "venv", "--clear", str(venv)])
        _run(
            [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{ROUTER_PACKAGE}=={ROUTER_VERSION}"]
        )
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        return None, f"could not install {ROUTER_PACKAGE}=={ROUTER_VERSION}: {exc}"
    if installed_version(python) != ROUTER_VERSION:
        return None, f"{ROUTER_PACKAGE}=={ROUTER_VERSION} installed into {venv} but does not import"
    return python, f"sglang-router installed into {venv}"


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"exit status {done.returncode}")


def smg_cache_dir() -> Path:
    return cache_dir().parent / f"smg-{SMG_VERSION}"


def smg_installed_version(binary: str) -> str | None:
    """The smg version the venv of ``binary`` holds, if that binary answers ``--help``; else None."""
    python = str(Path(binary).parent / "python")
    probe = "import importlib.metadata as m; print(m.version('smg'))"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60)
        runs = subprocess.run([binary, "launch", "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 and runs.returncode == 0 else None


def smg_binary() -> tuple[str | None, str]:
    """(the ``smg`` executable, note), installing ``smg==SMG_VERSION`` into a cached venv once; or (None, why
    the smg rows must be skipped)."""
    venv = smg_cache_dir()
    binary = str(venv / "bin" / "smg")
    if Path(binary).exists() and smg_installed_version(binary) == SMG_VERSION:
        return binary, f"smg from {venv}"
    print(f"installing {SMG_PACKAGE}=={SMG_VERSION} into {venv} (once) ...", flush=True)
    python = str(venv / "bin" / "python")
    try:
        _run([sys.executable, "-m", "venv", "--clear", str(venv)])
        _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{SMG_PACKAGE}=={SMG_VERSION}"])
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        return None, f"could not install {SMG_PACKAGE}=={SMG_VERSION}: {exc}"
    if smg_installed_version(binary) != SMG_VERSION:
        return None, f"{SMG_PACKAGE}=={SMG_VERSION} installed into {venv} but `smg launch --help` does not run"
    return binary, f"smg installed into {venv}"
