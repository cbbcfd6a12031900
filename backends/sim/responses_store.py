"""Stored responses: what ``GET /v1/responses/{id}`` returns and what ``previous_response_id`` continues.

Both engines keep responses in process memory only when told to (SGLang ``--enable-response-store``; vLLM
``VLLM_ENABLE_RESPONSES_API_STORE=1``) and never forget them; the simulator keeps the most recent ones, so a
long-running benchmark does not grow without bound.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from spillgate.backends.sim.config import ReplicaConfig
from spillgate.backends.sim.responses_input import Message

CAPACITY = 4096
"""Responses kept; the least recently used goes first."""
VLLM_STORE_ENV = "VLLM_ENABLE_RESPONSES_API_STORE"


@dataclass(frozen=True)
class StoredResponse:
    body: dict[str, Any]
    """The response object as it was answered."""
    turns: tuple[Message, ...]
    """The conversation a follow-up continues: the stored history, this request's input and the reply, without
    system turns."""


class ResponseStore:
    """Responses by id, at most ``capacity`` of them; ``enabled`` False keeps nothing."""

    def __init__(self, enabled: bool, capacity: int = CAPACITY) -> None:
        self.enabled = enabled
        self._capacity = capacity
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def get(self, response_id: str) -> StoredResponse | None:
        stored = self._items.get(response_id)
        if stored is not None:
            self._items.move_to_end(response_id)
        return stored

    def put(self, response_id: str, stored: StoredResponse) -> None:
        if not self.enabled:
            return
        self._items[response_id] = stored
        self._items.move_to_end(response_id)
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


def store_enabled(config: ReplicaConfig, environ: dict[str, str] | None = None) -> bool:
    """Whether this replica keeps responses: SGLang's flag, or vLLM's environment variable (read as vLLM reads its
    boolean variables: an integer, non-zero for on)."""
    if config.engine != "vllm":
        return config.enable_response_store
    value = (os.environ if environ is None else environ).get(VLLM_STORE_ENV, "0").strip()
    try:
        return bool(int(value or "0"))
    except ValueError:
        return False
