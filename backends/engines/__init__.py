"""The engines a pool can name (``engine:``), each in its own module that registers it; see :class:`Engine`."""

from __future__ import annotations

# Each built-in engine's module registers it when imported.
from spillgate.backends.engines import openai, sglang, vllm  # noqa: F401
from spillgate.backends.engines.base import (
    Engine,
    KvEventSource,
    ReplicaInfo,
    ReplicaLoad,
    engine_named,
    engine_names,
    register_engine,
)

__all__ = ["Engine", "KvEventSource", "ReplicaInfo", "ReplicaLoad", "engine_named", "engine_names", "register_engine"]
