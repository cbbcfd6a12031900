"""Any OpenAI-compatible server (a TGI, llama.cpp or LM Studio endpoint, another gateway): no engine signals.

Alive when ``/v1/models`` answers; its context window comes from there when listed. No load, capacity or cache
figures: routing counts only the gateway's own requests, and prefix affinity works from the gateway's index.
"""

from __future__ import annotations

from typing import ClassVar

from spillgate.backends.engines.base import (
    Engine,
    Get,
    ReplicaInfo,
    ReplicaLoad,
    model_context_window,
    register_engine,
)


class OpenAICompatible(Engine):
    name: ClassVar[str] = "openai"
    liveness_path: ClassVar[str] = "/v1/models"
    metrics_path: ClassVar[str | None] = None

    def parse_load(self, text: str) -> ReplicaLoad:
        return ReplicaLoad()

    async def describe(self, get: Get, served_model: str) -> ReplicaInfo:
        return ReplicaInfo(context_window=await model_context_window(get, served_model))


register_engine(OpenAICompatible())
