"""Create, or find already made, what the real-engine tier runs: one venv per engine and the tiny model.

Everything lands in a cache directory outside the repository (``SPILLGATE_ENGINES_DIR``, else
``$XDG_CACHE_HOME/spillgate/engines``, else ``~/.cache/spillgate/engines``), named after the lock file it was
built from, so a changed lock builds a new venv and an unchanged one is reused. The locks pin every package
(installed with ``--no-deps``: no resolver, the same set every time); the CPU builds of torch come from
PyTorch's CPU index, which a machine without it can name in ``PIP_EXTRA_INDEX_URL``
(``https://download.pytorch.org/whl/cpu``).

    python -m tests.engines.install [sglang] [vllm]    # prints the venvs and the model, one a line

Exits with status 3 and one line on stderr when something cannot be installed here.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENGINES = ("sglang", "vllm")
UNAVAILABLE = 3
"""Exit status for "this machine cannot run the engines" (the tier skips rather than fails where allowed)."""


@dataclass(frozen=True)
class Installed:
    python: dict[str, Path]
    """Each engine's venv Python."""
    model: Path


class CannotInstall(RuntimeError):
    """An engine or the model cannot be installed here; the message says why in one line."""


def cache_dir() -> Path:
    explicit = os.environ.get("SPILLGATE_ENGINES_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "spillgate" / "engines"


def lock_file(engine: str) -> Path:
    return HERE / f"{engine}.lock"


def _digest(*paths: Path) -> str:
    sha = hashlib.sha256()
    for path in paths:
        sha.update(path.read_bytes())
    return sha.hexdigest()[:12]


def venv_dir(engine: str) -> Path:
    return cache_dir() / f"{engine}-{_digest(lock_file(engine))}"


def model_dir() -> Path:
    return cache_dir() / f"tiny-llama-{_digest(HERE / 'tiny_model.py')}"


def ensure_venv(engine: str, log: Path) -> Path:
    """The engine's venv Python, building the venv first unless a finished one is there."""
    target = venv_dir(engine)
    python = target / "bin" / "python"
    if (target / ".complete").exists():
        return python
    if target.exists():
        shutil.rmtree(target)  # an install that did not finish
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"installing {engine} into {target} (several minutes, once)", file=sys.stderr)
    with log.open("ab") as out:
        steps = [
            [sys.executable, "-m", "venv", str(target)],
            [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-cache-dir", "-r", str(lock_file(engine))],
        ]
        for step in steps:
            if subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, check=False).returncode != 0:
                raise CannotInstall(
                    f"installing {engine} failed (pip could not install {lock_file(engine).name}; log: {log})"
                )
    (target / ".complete").write_text(f"{time.monotonic() - started:.0f} s\n")
    return python


def ensure_model(python: Path, log: Path) -> Path:
    """The tiny model, made with an engine's Python (it has torch and transformers) unless already there."""
    target = model_dir()
    if (target / "spillgate-model.json").exists():
        return target
    with log.open("ab") as out:
        done = subprocess.run(
            [str(python), str(HERE / "tiny_model.py"), str(target)], stdout=out, stderr=subprocess.STDOUT, check=False
        )
    if done.returncode != 0:
        raise CannotInstall(f"making the tiny model failed (log: {log})")
    return target


def installed_already(engines: tuple[str, ...] = ENGINES) -> Installed | None:
    """What :func:`ensure` would return, if everything is already there; installs nothing."""
    pythons = {engine: venv_dir(engine) / "bin" / "python" for engine in engines}
    complete = all((venv_dir(engine) / ".complete").exists() for engine in engines)
    model = model_dir()
    if not complete or not (model / "spillgate-model.json").exists():
        return None
    return Installed(pythons, model)


def ensure(engines: tuple[str, ...] = ENGINES) -> Installed:
    """Every named engine's venv and the model; raises :class:`CannotInstall` with the reason."""
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        raise CannotInstall(f"the engines' CPU builds are for x86-64 Linux, not {sys.platform} {os.uname().machine}")
    cache_dir().mkdir(parents=True, exist_ok=True)
    log = cache_dir() / "install.log"
    pythons = {engine: ensure_venv(engine, log) for engine in engines}
    return Installed(pythons, ensure_model(next(iter(pythons.values())), log))


def main(argv: list[str]) -> int:
    engines = tuple(argv) or ENGINES
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        print(f"unknown engine(s) {unknown}; known: {list(ENGINES)}", file=sys.stderr)
        return 2
    try:
        installed = ensure(engines)
    except CannotInstall as exc:
        print(f"real engines unavailable: {exc}", file=sys.stderr)
        return UNAVAILABLE
    for engine, python in installed.python.items():
        print(f"{engine} {python}")
    print(f"model {installed.model}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
