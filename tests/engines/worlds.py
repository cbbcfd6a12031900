"""The worlds a gateway test can run in: real SGLang, real vLLM, or the simulator standing in for them.

A :class:`World` starts replicas of one engine and says how that engine is named in a pool and how many tokens a
text makes there, so the same test body asserts the same behaviour against each. The real worlds carry the
``engines`` mark: ``make test`` runs the simulator's, ``make test-engines`` the real ones.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from spillgate.backends.sim.tokenizer import Tokenizer as SimTokenizer
from tests.engines.install import Installed, installed_already
from tests.engines.servers import RECOMMENDED, SERVED_MODEL, model_context, start_engine
from tests.support.gateway import start_replica
from tests.support.procs import RunningProcess

SIM_CONTEXT = 16384
"""The simulated replicas' context length, as the tiny model's."""


@dataclass
class World:
    name: str
    engine: str
    """The pool's ``engine:``."""
    context: int
    recommended: tuple[str, ...]
    start: Callable[..., RunningProcess]
    """``start(log_dir, *flags, port=None)``: one replica with ``flags`` added to the world's base flags."""
    count_tokens: Callable[[str], int]
    real: bool
    python: Path | None = None
    """The engine's venv Python (it has pyzmq and msgspec, for KV-event listeners); None for the simulator."""
    started: list[RunningProcess] = field(default_factory=list)

    def replica(self, log_dir: Path, *flags: str, port: int | None = None) -> RunningProcess:
        """A replica stopped with the world (or earlier by the test)."""
        proc = self.start(log_dir, *flags, port=port)
        self.started.append(proc)
        return proc

    def pool(self, urls: list[str], **extra: Any) -> dict[str, Any]:
        return {"name": "pool", "served_model": SERVED_MODEL, "engine": self.engine, "replicas": urls, **extra}

    def stop(self) -> None:
        for proc in self.started:
            proc.stop()


def real_world(engine: str, installed: Installed) -> World:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(installed.model / "tokenizer.json"))

    def start(log_dir: Path, *flags: str, port: int | None = None) -> RunningProcess:
        return start_engine(installed, engine, log_dir, *flags, port=port)

    return World(
        name=engine,
        engine=engine,
        context=model_context(installed),
        recommended=RECOMMENDED[engine],
        start=start,
        count_tokens=lambda text: len(tokenizer.encode(text).ids),
        real=True,
        python=installed.python[engine],
    )


def sim_world(engine: str) -> World:
    """The simulator with ``engine``'s face."""
    tokenizer = SimTokenizer()

    def start(log_dir: Path, *flags: str, port: int | None = None) -> RunningProcess:
        base = ("--time-scale", "0.05", "--model-name", SERVED_MODEL, "--context-length", str(SIM_CONTEXT))
        return start_replica(log_dir, *base, "--engine", engine, *flags, port=port, bare=True)

    return World(
        name=f"sim-{engine}",
        engine=engine,
        context=SIM_CONTEXT,
        recommended=RECOMMENDED[engine],
        start=start,
        count_tokens=lambda text: len(tokenizer.encode(text)),
        real=False,
    )


WORLDS = [
    pytest.param("sim-sglang"),
    pytest.param("sim-vllm"),
    pytest.param("sglang", marks=pytest.mark.engines),
    pytest.param("vllm", marks=pytest.mark.engines),
]


def make_world(name: str) -> Iterator[World]:
    """The world ``name``; a real one skips, in one line, where the engines are not installed."""
    if name.startswith("sim-"):
        world = sim_world(name.removeprefix("sim-"))
    else:
        installed = installed_already((name,))
        if installed is None:
            reason = f"real {name} is not installed here: run `make engines` (see docs/testing.md)"
            if os.environ.get("SPILLGATE_REQUIRE_ENGINES"):
                pytest.fail(reason)
            pytest.skip(reason)
        world = real_world(name, installed)
    try:
        yield world
    finally:
        world.stop()
