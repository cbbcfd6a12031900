"""Prompts held at the gateway while their replica already has enough prefill waiting unscheduled."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support.gateway import TENANT_KEY, hang_up_while_held, serve_one_slow_replica, streamed_usage, words
from tests.support.procs import RunningProcess


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    """Any prompt waiting unscheduled at the replica is enough to hold the next one."""

    def hold_early(config: dict[str, Any]) -> None:
        config["pools"][0]["max_waiting_prefill_tokens"] = 1

    yield from serve_one_slow_replica(tmp_path_factory.mktemp("prompt-hold"), hold_early)


def stream(client: openai.OpenAI, prompt: str) -> int:
    """Prompt tokens of one streamed answer, read to its end."""
    return streamed_usage(client, "chat", [{"role": "user", "content": prompt}]).prompt_tokens


def holds(gateway: RunningProcess) -> str:
    metrics = httpx.get(gateway.url + "/metrics").text
    return next((line for line in metrics.splitlines() if line.startswith("spillgate_prompt_holds_total")), "")


def test_a_prompt_waits_for_the_batch_ahead_to_form_then_is_served(gateway: RunningProcess) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    results: dict[str, int] = {}

    def send(name: str, prompt: str) -> None:
        results[name] = stream(client, prompt)

    blocker = threading.Thread(target=send, args=("blocker", words("block", 2000)))
    blocker.start()
    time.sleep(0.15)  # the replica is prefilling the blocker
    waiting = threading.Thread(target=send, args=("waiting", words("wait", 1000)))
    waiting.start()
    time.sleep(0.1)  # the second prompt waits at the replica for the blocker's batch to end
    send("held", words("held", 1000))
    waiting.join()
    blocker.join()
    assert re.fullmatch(r'spillgate_prompt_holds_total\{backend="pool/127\.0\.0\.1:\d+"\} 1\.0', holds(gateway))
    assert all(results[name] > 1000 for name in ("blocker", "waiting", "held")), "each was answered to the end"


def test_a_client_that_leaves_while_its_prompt_is_held_was_never_served(gateway: RunningProcess) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    before = holds(gateway)
    blocker = threading.Thread(target=stream, args=(client, words("wall", 2000)))
    blocker.start()
    time.sleep(0.15)
    waiting = threading.Thread(target=stream, args=(client, words("queue", 1000)))
    waiting.start()
    time.sleep(0.1)
    # Held for the blocker's batch:
    hang_up_while_held(gateway, "chat", [{"role": "user", "content": words("leave", 1000)}])
    waiting.join()
    blocker.join()
    assert before != holds(gateway), "the prompt was held"
    metrics = httpx.get(gateway.url + "/metrics").text
    assert 'backend="-",outcome="client_disconnected",reason="-",route="chat"} 1.0' in metrics
    # The replica's queue carries on without it (its freed place itself is checked in tests/unit/test_coalesce.py).
    assert stream(client, words("after", 1000)) > 1000
