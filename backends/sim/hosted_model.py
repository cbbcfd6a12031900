"""The simulated hosted model itself, shared by both wire formats: latency profile, output, caching, faults.

Unlike a replica it has no KV cache or batching: every request waits its own TTFT, then streams
one token per TPOT, each jittered deterministically from the request and the seed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import xxhash

from spillgate.backends.sim.chat_template import ChatTemplate
from spillgate.backends.sim.clock import VirtualClock
from spillgate.backends.sim.generation import OutputPlan, TokenStream, plan_output, request_seed
from spillgate.backends.sim.hosted_cache import PromptCache
from spillgate.backends.sim.hosted_faults import FaultConfig, FaultSchedule
from spillgate.backends.sim.tokenizer import Tokenizer


@dataclass(frozen=True)
class HostedConfig:
    """Options of ``spillgate sim-hosted``."""

    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "frontier-large"
    ttft_ms: float = 350.0
    tpot_ms: float = 12.0
    jitter: float = 0.1
    time_scale: float = 1.0
    seed: int = 0
    prompt_cache_min_tokens: int = 1024
    api_key: str | None = None
    """The one key accepted, as a provider accepts its customer's; None: any non-empty key."""
    faults: FaultConfig = field(default_factory=FaultConfig)


def key_accepted(key: str, config: HostedConfig) -> bool:
    """Any non-empty key, or only the configured one."""
    key = key.strip()
    return bool(key) and (config.api_key is None or key == config.api_key)


class SimHostedModel:
    """Latency profile, deterministic output, prompt cache and fault schedule of one simulated server."""

    def __init__(self, config: HostedConfig) -> None:
        self.config = config
        self.clock = VirtualClock(config.time_scale)
        self.tokenizer = Tokenizer()
        self.template = ChatTemplate(self.tokenizer)
        self.cache = PromptCache(config.prompt_cache_min_tokens)
        self.faults = FaultSchedule(config.faults)
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Cut every stream short at its next token and end every stall (server shutdown)."""
        self._stopping.set()

    async def stall(self) -> None:
        """Go silent until the server shuts down (or the client goes away and the task is cancelled)."""
        await self._stopping.wait()

    def jittered(self, base_ms: float, seed: int, index: int) -> float:
        """``base_ms`` in seconds, times a factor in [1 - jitter, 1 + jitter] fixed by seed and index."""
        unit = xxhash.xxh64_intdigest(index.to_bytes(8, "little"), seed=seed) / 2**64
        return base_ms / 1000 * (1 + self.config.jitter * (2 * unit - 1))

    def plan(self, prompt_ids: list[int], limit: int | None, request_seed_value: int | None) -> tuple[int, OutputPlan]:
        seed = request_seed(prompt_ids, self.config.seed, request_seed_value)
        return seed, plan_output(seed, limit, exact=limit is not None)

    async def tokens(self, seed: int, plan: OutputPlan, cut_after: int | None = None) -> AsyncIterator[int]:
        """Output ids, each released at its simulated time (TTFT, then one TPOT per token).

        ``cut_after`` ends the stream early after that many tokens (an injected fault follows).
        """
        stream = TokenStream(self.tokenizer, seed, plan)
        deadline = self.clock.now() + self.jittered(self.config.ttft_ms, seed, 0)
        length = plan.length if cut_after is None else min(plan.length, cut_after)
        for index in range(length):
            if self._stopping.is_set():
                return
            if index:
                deadline += self.jittered(self.config.tpot_ms, seed, index)
            await self.clock.sleep_until(deadline)
            yield stream.next_id()


def finish_reason(plan: OutputPlan) -> str:
    """OpenAI's finish reason for a request that ran to its plan."""
    return "stop" if plan.stops else "length"
