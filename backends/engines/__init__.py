"""The engines a pool can name (``engine:``), each in its own module; see :class:`Engine`."""

from __future__ import annotations

from typing import Literal

from spillgate.backends.engines.base import Engine, ReplicaInfo, ReplicaLoad
from spillgate.backends.engines.openai import OpenAICompatible
from spillgate.backends.engines.sglang import SGLang
from spillgate.backends.engines.vllm import VLLM

EngineName = Literal["sglang", "vllm", "openai"]
ENGINES: dict[str, Engine] = {engine.name: engine for engine in (SGLang(), VLLM(), OpenAICompatible())}


def engine_named(name: str) -> Engine:
    """The engine a pool's ``engine:`` names."""
    return ENGINES[name]


__all__ = ["ENGINES", "Engine", "EngineName", "ReplicaInfo", "ReplicaLoad", "engine_named"]
