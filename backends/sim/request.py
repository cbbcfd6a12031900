"""One generation request as the scheduler and its HTTP caller share it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from spillgate.backends.sim.generation import OutputPlan, TokenStream
from spillgate.backends.sim.radix_cache import TreeNode


@dataclass(eq=False)
class SimRequest:
    """Prompt, output so far, timestamps (simulated seconds) and the KV the request holds.

    The scheduler appends output and calls :meth:`notify`; the caller awaits :meth:`wait_for_change`
    and reads ``output_ids`` from where it left off, so a slow reader gets tokens in batches.
    """

    rid: str
    input_ids: list[int]
    max_new_tokens: int
    plan: OutputPlan
    tokens: TokenStream
    arrival: float
    namespace: str | None = None
    priority: int | None = None
    output_ids: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    num_retractions: int = 0
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: dict[str, Any] | None = None
    abort_requested: bool = False
    # KV held: ``kv_len`` tokens have KV; the first ``tree_len`` of them are in the radix tree
    # under ``node`` (locked); the rest are private to this request.
    node: TreeNode | None = None
    tree_len: int = 0
    kv_len: int = 0
    _changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def fill_len(self) -> int:
        """Tokens that need KV before the next token can be produced (prompt plus output so far)."""
        return len(self.input_ids) + len(self.output_ids)

    def fill_ids(self, upto: int) -> list[int]:
        if upto <= len(self.input_ids):
            return self.input_ids[:upto]
        return self.input_ids + self.output_ids[: upto - len(self.input_ids)]

    def notify(self) -> None:
        self._changed.set()

    async def wait_for_change(self) -> None:
        await self._changed.wait()
        self._changed.clear()
