"""A toy engine for a made-up server, toyserve: ``/alive`` answers while the process lives, ``/stats`` lists its
load as ``name value`` lines, and ``/limits`` says how much it holds."""

from __future__ import annotations

from typing import ClassVar

from spillgate.backends.engines import Engine, ReplicaInfo, ReplicaLoad, register_engine
from spillgate.backends.engines.base import Get, as_int


class ToyServe(Engine):
    name: ClassVar[str] = "toyserve"
    liveness_path: ClassVar[str] = "/alive"
    metrics_path: ClassVar[str | None] = "/stats"

    def parse_load(self, text: str) -> ReplicaLoad:
        figures: dict[str, float] = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if value.strip():
                figures[name] = float(value)
        return ReplicaLoad(
            running=int(figures.get("running", 0)),
            queued=int(figures.get("waiting", 0)),
            token_usage=figures.get("kv_used", 0.0),
            prompt_tokens_total=figures.get("prompt_tokens", 0.0),  # going down means it restarted
        )

    async def describe(self, get: Get, served_model: str) -> ReplicaInfo:
        response = await get("/limits")
        response.raise_for_status()
        limits = response.json()
        return ReplicaInfo(
            max_total_tokens=as_int(limits.get("kv_tokens")),
            context_window=as_int(limits.get("context")),
            metrics=True,  # keep scraping /stats
        )


register_engine(ToyServe())
