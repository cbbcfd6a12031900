"""Prompts held at the gateway while their replica already has a prefill batch's worth waiting."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.gateway import TENANT_KEY, gateway_config, start_gateway, start_replica
from tests.support.procs import RunningProcess


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    """One replica at a third of real speed (the blocker's prefill takes about half a second there); any
    prompt waiting unscheduled there is enough to hold the next one."""
    log_dir: Path = tmp_path_factory.mktemp("prompt-hold")
    replica = start_replica(log_dir, "--preset", "llama-3.1-8b-h100", "--time-scale", "3")
    config = gateway_config([replica.url])
    config["pools"][0]["max_waiting_prefill_tokens"] = 1
    gateway = start_gateway(config, log_dir)
    yield gateway
    gateway.stop()
    replica.stop()


def words(tag: str, count: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(count))


def stream(client: openai.OpenAI, prompt: str) -> tuple[int, str]:
    """Prompt tokens and text of one streamed answer."""
    chunks = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, prompt_tokens = "", 0
    for chunk in chunks:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            prompt_tokens = chunk.usage.prompt_tokens
    return prompt_tokens, text


def holds(gateway: RunningProcess) -> str:
    metrics = httpx.get(gateway.url + "/metrics").text
    return next((line for line in metrics.splitlines() if line.startswith("spillgate_prompt_holds_total")), "")


def test_a_prompt_waits_for_the_batch_ahead_to_form_then_is_served(gateway: RunningProcess) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    results: dict[str, tuple[int, str]] = {}

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
    assert holds(gateway) == 'spillgate_prompt_holds_total{backend="pool-0"} 1.0'
    for name in ("blocker", "waiting", "held"):
        prompt_tokens, text = results[name]
        assert prompt_tokens > 1000 and text, f"{name} was answered in full"


def test_a_client_that_leaves_while_its_prompt_is_held_was_never_served(gateway: RunningProcess) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    before = holds(gateway)
    blocker = threading.Thread(target=stream, args=(client, words("wall", 2000)))
    blocker.start()
    time.sleep(0.15)
    waiting = threading.Thread(target=stream, args=(client, words("queue", 1000)))
    waiting.start()
    time.sleep(0.1)
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": words("leave", 1000)}],
        "max_tokens": 2,
        "stream": True,
    }
    headers = {"authorization": f"Bearer {TENANT_KEY}"}
    with pytest.raises(httpx.ReadTimeout):  # held for the blocker's batch: nothing comes back in 0.1 s
        httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=httpx.Timeout(5, read=0.1))
    waiting.join()
    blocker.join()
    assert before != holds(gateway), "the prompt was held"
    metrics = httpx.get(gateway.url + "/metrics").text
    assert 'backend="-",outcome="client_disconnected",reason="-",route="chat"} 1.0' in metrics
    # Its place is free: the next prompt is not held behind a request nobody waits for.
    assert stream(client, words("after", 1000))[1]
