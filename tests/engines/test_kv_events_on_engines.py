"""Exact prefix routing from real SGLang's and vLLM's KV-cache events, through the gateway.

Each engine runs four replicas on a CPU with a KV cache of 2,048 tokens, so that the workload (eight chats, each
with a system prompt of about 600 tokens and follow-up turns) evicts: two publish their events on a socket
they bind with a replay socket beside it, one publishes without a replay socket, one publishes nothing. The
gateway reads the engine's own prompt ids through the tiny model's chat template (``prefix.tokenizer`` names its
directory) and learns where each replica publishes from the replica itself. Its ``/health`` counts, per replica
and per source, how the cached blocks it predicted compared with the ``cached_tokens`` the replica reported.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from spillgate.gateway.tenancy.tenants import Tenant
from tests.engines.install import Installed, installed_already
from tests.engines.servers import RECOMMENDED, SERVED_MODEL, start_engine
from tests.engines.worlds import World, make_world
from tests.support.gateway import TENANT_KEY, gateway_config, replica_name, start_gateway
from tests.support.procs import RunningProcess

pytestmark = [
    pytest.mark.engines,
    pytest.mark.skipif(
        os.environ.get("SPILLGATE_KV_EVENTS_TIER") != "1",
        reason="10-15 minutes on 2 cores: run with SPILLGATE_KV_EVENTS_TIER=1 make test-engines (docs/testing.md)",
    ),
]

CONTEXT = 2048
"""Each replica's context and KV cache, in tokens: about three of the workload's chats."""
BLOCK = 64
"""The gateway's block (``prefix.block_tokens``' default)."""
HEALTH = {"interval_s": 0.25, "timeout_s": 10.0, "unhealthy_after": 2, "generation_check_s": 5}
"""Patient probes: four engines share two cores, and an idle one can take seconds to answer."""
EXACT = {"ignore_eos": True}
"""The tiny model's weights are random: without this it may end a reply at any token."""
HELD = 512
"""Cached tokens showing a chat's system prompt (about 570 tokens) held: four of vLLM's 128-token blocks."""
SALT = Tenant("tenant-a", frozenset(), isolation="salted").cache_salt(None)
"""The cache salt the gateway gives the test tenant's requests: a request sent to a replica directly needs it to
share that tenant's cache."""


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    yield from make_world(request.param)


def quiet_port() -> int:
    """A free port below the kernel's ephemeral range, for an engine's server or publisher. The engine binds it
    minutes after it is chosen, and the ports that four engines starting meanwhile ask the kernel for (port 0) come
    from that range, so none takes it."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 32768
    while True:
        port = random.randrange(10000, low)
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
        return port


def publisher(engine: str, *, replay: bool) -> tuple[str, ...]:
    """``--kv-events-config`` for a publisher that binds (the gateway connects to it), on fresh ports."""
    port, replay_port = quiet_port(), quiet_port()
    if engine == "sglang":
        host = "127.0.0.1"
        config: dict[str, Any] = {"publisher": "zmq", "endpoint": f"tcp://{host}:{port}", "topic": "kv", "bind": True}
    else:  # vLLM binds only where its endpoint names no host
        host = "*"
        config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": "kv"}
    if replay:
        config["replay_endpoint"] = f"tcp://{host}:{replay_port}"
    return ("--kv-events-config", json.dumps(config))


@dataclass
class Replicas:
    """The module's replicas by role, each restartable with its own flags on its own ports."""

    world: World
    installed: Installed
    log_dir: Path
    flags: dict[str, tuple[str, ...]]
    running: dict[str, RunningProcess] = field(default_factory=dict)

    def start(self, role: str, port: int | None = None) -> RunningProcess:
        engine = self.world.engine
        # vLLM on a CPU keeps one of its 128-token blocks aside: one more holds a whole context.
        kv_tokens = CONTEXT + 128 if engine == "vllm" else CONTEXT
        port = port or quiet_port()
        proc = start_engine(
            self.installed, engine, self.log_dir, *self.flags[role], port=port, kv_tokens=kv_tokens, context=CONTEXT
        )
        self.running[role] = proc
        self.world.started.append(proc)
        return proc

    def restart(self, role: str) -> RunningProcess:
        """Stopped, and started again on the same ports (its log beside the first one's)."""
        old = self.running[role]
        old.stop()
        self.log_dir = self.log_dir / "restarted"
        return self.start(role, port=int(old.url.rsplit(":", 1)[1]))

    def url(self, role: str) -> str:
        return self.running[role].url

    def name(self, role: str) -> str:
        """What a gateway over the role's replica calls it (its address names it, the same after a restart)."""
        return replica_name(self.url(role))


@pytest.fixture(scope="module")
def replicas(world: World, tmp_path_factory: pytest.TempPathFactory) -> Replicas:
    """``a`` and ``b`` publish with a replay socket, ``late`` without one, ``plain`` not at all; started together."""
    installed = installed_already((world.engine,))
    assert installed is not None
    engine = world.engine
    caching = ("--enable-prefix-caching",) if engine == "vllm" else ()
    base = (*RECOMMENDED[engine], *caching)
    flags = {
        "a": (*base, *publisher(engine, replay=True)),
        "b": (*base, *publisher(engine, replay=True)),
        "late": (*base, *publisher(engine, replay=False)),
        "plain": base,
    }
    started = Replicas(world, installed, tmp_path_factory.mktemp(f"{engine}-kv-replicas"), flags)
    with ThreadPoolExecutor(len(flags)) as pool:
        list(pool.map(started.start, flags))
    return started


def kv_gateway(replicas: Replicas, roles: list[str], log_dir: Path) -> RunningProcess:
    """A gateway over ``roles`` (each named by :meth:`Replicas.name`) reading the engine's own prompt ids."""
    config = gateway_config([])
    pool = {"name": "pool", "served_model": SERVED_MODEL, "engine": replicas.world.engine}
    config["pools"] = [{**pool, "replicas": [replicas.url(role) for role in roles]}]
    config["routes"].append({"name": "aware", "targets": ["pool"], "policy": "cache_aware"})
    config["routes"].append({"name": "hashed", "targets": ["pool"], "policy": "consistent_hash"})
    config["prefix"] = {"tokenizer": str(replicas.installed.model), "block_tokens": BLOCK}
    config["health"] = HEALTH
    return start_gateway(config, log_dir)


@pytest.fixture(scope="module")
def gateway(replicas: Replicas, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    """Over ``a`` and ``b``, started before the workload."""
    proc = kv_gateway(replicas, ["a", "b"], tmp_path_factory.mktemp(f"{replicas.world.engine}-kv-gateway"))
    yield proc
    proc.stop()


def prefix_health(gateway: RunningProcess) -> dict[str, dict[str, Any]]:
    backends = httpx.get(gateway.url + "/health", timeout=30).json()["backends"]
    return {name: backend["prefix"] for name, backend in backends.items() if "prefix" in backend}


def conversation(group: int, turns: int) -> list[dict[str, str]]:
    """A system prompt of about 570 tokens, ``turns`` exchanges, and the next question."""
    system = f"Manual {group}. " + " ".join(f"rule{group}x{i}." for i in range(60))
    messages = [{"role": "system", "content": system}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn} about item {group * 7 + turn}"})
        messages.append({"role": "assistant", "content": f"answer {turn} is {group * 3 + turn}"})
    messages.append({"role": "user", "content": f"question {turns} about item {group * 7 + turns}"})
    return messages


@dataclass
class Answer:
    backend: str
    reason: str
    prompt_tokens: int
    cached_tokens: int


def ask(gateway: RunningProcess, messages: list[dict[str, str]], model: str = "aware") -> Answer:
    sdk = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0, timeout=120)
    raw = sdk.chat.completions.with_raw_response.create(model=model, messages=messages, max_tokens=2, extra_body=EXACT)
    usage = raw.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None, "the replica reports cached tokens"
    return Answer(
        raw.headers["x-spillgate-backend"],
        raw.headers["x-spillgate-reason"],
        usage.prompt_tokens,
        usage.prompt_tokens_details.cached_tokens or 0,
    )


def ask_replica(url: str, messages: list[dict[str, str]]) -> int:
    """Sent to the replica itself, in the test tenant's cache; its cached tokens."""
    body = {"model": SERVED_MODEL, "messages": messages, "max_tokens": 2, "cache_salt": SALT, **EXACT}
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    response.raise_for_status()
    return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def wait_for(gateway: RunningProcess, what: str, check: Any, seconds: float = 60, poke: Any = None) -> Any:
    """``check(prefix_health(gateway))`` until truthy (``poke()`` between looks); its last value in the failure."""
    deadline = time.monotonic() + seconds
    while True:
        seen = prefix_health(gateway)
        if check(seen):
            return seen
        assert time.monotonic() < deadline, f"{what}: {json.dumps(seen, indent=1)}"
        if poke is not None:
            poke()
        time.sleep(0.3)


def sources(seen: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: prefix["source"] for name, prefix in seen.items()}


OUTCOMES = ("exact", "over", "under")
POKE = [{"role": "user", "content": " ".join(f"hello{i}" for i in range(100))}]
"""A request that makes a replica publish: vLLM publishes nothing until it stores a whole block (128 tokens)."""


def counts(seen: dict[str, dict[str, Any]], source: str = "events") -> dict[str, dict[str, int]]:
    """Per replica, how its predictions from ``source`` compared: ``{"exact": n, "over": n, "under": n}``."""
    return {
        name: {outcome: prefix["predictions"].get(source, {}).get(outcome, 0) for outcome in OUTCOMES}
        for name, prefix in seen.items()
    }


def since(then: dict[str, int], now: dict[str, int]) -> dict[str, int]:
    return {outcome: now[outcome] - then[outcome] for outcome in OUTCOMES}


def test_predictions_from_events_match_the_replicas_through_evictions(
    gateway: RunningProcess, replicas: Replicas
) -> None:
    """Eight chats with long system prompts, two turns in a row each, twice over: more than both caches hold, so
    the second pass finds its first turns evicted. Every prediction comes from complete events and matches the
    replica's own count of cached tokens.

    One client, one request at a time: with two at once, a request on the same replica may evict blocks between the
    gateway's decision and the prefill of a request counting on them, which no prediction made when routing can
    know. A chat's first turn in each pass is placed by its system prompt's hash, so that the chats spread over both
    replicas; its follow-up is routed by cache."""
    wait_for(
        gateway,
        "both replicas followed from their first batch",
        lambda seen: set(sources(seen).values()) == {"events"} and len(seen) == 2,
        poke=lambda: ask(gateway, POKE, "chat-rr"),
    )
    answers: list[tuple[int, int, Answer]] = []
    started = time.monotonic()
    for pass_ in range(2):
        for group in range(8):
            turn = 2 * pass_
            answers.append((group, turn, ask(gateway, conversation(group, turn), "hashed")))
            answers.append((group, turn + 1, ask(gateway, conversation(group, turn + 1))))
    took = time.monotonic() - started

    seen = prefix_health(gateway)
    assert set(sources(seen).values()) == {"events"}, seen
    assert all(prefix["events"]["complete"] and prefix["events"]["gaps"] == 0 for prefix in seen.values()), seen
    by_replica = counts(seen)
    total = sum(sum(c.values()) for c in by_replica.values())
    exact = sum(c["exact"] for c in by_replica.values())
    figures = f"{exact}/{total} exact; per replica {by_replica}; workload {took:.0f} s"
    print(f"predictions from events: {figures}")
    assert total >= len(answers), figures
    assert exact >= 0.99 * total, figures
    # The workload evicted: the first chats' second turns, held where they were answered, are gone from there.
    urls = {replicas.name(role): replicas.url(role) for role in ("a", "b")}
    homes = {group: answer.backend for group, turn, answer in answers if turn == 1}
    left = {group: ask_replica(urls[homes[group]], conversation(group, 1)) for group in (0, 1)}
    assert any(cached < HELD for cached in left.values()), f"nothing evicted: cached tokens now {left}; {answers}"
    follow_ups = [answer for _, turn, answer in answers if turn % 2 == 1]
    assert all(a.reason == "prefix_hit" and a.cached_tokens >= HELD for a in follow_ups), follow_ups


def test_a_late_gateway_catches_up_through_the_replay_socket(
    replicas: Replicas, gateway: RunningProcess, tmp_path: Path
) -> None:
    """A gateway started after the replicas served traffic replays each replica's events from its first batch:
    its record is complete and routes a prompt the replica holds there, predicted exactly. Without a replay
    socket the record stays incomplete (``events+belief``); without events there is only the belief."""
    held = {role: conversation(40 + index, 1) for index, role in enumerate(["a", "b", "late", "plain"])}
    for role, messages in held.items():
        ask_replica(replicas.url(role), messages)
    time.sleep(0.5)
    # How far a and b have published, as the module's gateway (over a and b, following them live) heard it.
    live = {role: prefix_health(gateway)[replicas.name(role)]["events"]["last_seq"] for role in ("a", "b")}
    joined = kv_gateway(replicas, ["a", "b", "late", "plain"], tmp_path)
    try:
        names = {role: replicas.name(role) for role in ("a", "b", "late", "plain")}
        # ``complete`` is true from the first replayed batch on, while later ones are still being replayed: the
        # record has caught up once it reaches where the replicas have published.
        seen = wait_for(
            joined,
            "a and b replayed from their first batch up to where they have published",
            lambda seen: all(
                seen[names[r]].get("events", {}).get("complete") and seen[names[r]]["events"]["last_seq"] >= live[r]
                for r in ("a", "b")
            ),
        )
        assert seen[names["late"]]["source"] == "events+belief", seen
        assert seen[names["late"]]["events"]["replay"] is None and not seen[names["late"]]["events"]["complete"]
        assert seen[names["plain"]]["source"] == "belief" and "events" not in seen[names["plain"]], seen
        for role in ("a", "b"):
            assert seen[names[role]]["source"] == "events"
            assert seen[names[role]]["events"]["batches"] > 0, seen

        for role in ("a", "b"):
            answer = ask(joined, held[role])
            assert (answer.backend, answer.reason) == (names[role], "prefix_hit"), answer
            assert answer.cached_tokens >= HELD, answer
        # What ``late`` stores from now on is heard, but what it stored before stays unknown.
        ask_replica(replicas.url("late"), conversation(50, 0))
        seen = wait_for(joined, "late's new batch heard", lambda seen: seen[names["late"]]["events"]["batches"] > 0)
        assert seen[names["late"]]["source"] == "events+belief", seen
        by_replica = counts(seen)
        for role in ("a", "b"):
            assert by_replica[names[role]] == {"exact": 1, "over": 0, "under": 0}, seen
    finally:
        joined.stop()


def test_a_chat_ending_with_the_assistants_turn_is_predicted_exactly(gateway: RunningProcess, world: World) -> None:
    """A client may end a chat with a long assistant message (a reply for the model to go on with): sent twice,
    the second is predicted as the replica reports it. SGLang renders that message as the user's (unless the
    request continues it), vLLM as the assistant's; the gateway renders as the route's engine does."""
    wait_for(
        gateway,
        "both replicas followed",
        lambda seen: set(sources(seen).values()) == {"events"} and len(seen) == 2,
        poke=lambda: ask(gateway, POKE, "chat-rr"),
    )
    messages = conversation(70, 1)
    messages[-1] = {"role": "assistant", "content": " ".join(f"draft{i}" for i in range(60))}
    before = counts(prefix_health(gateway))
    for _ in range(2):
        ask(gateway, messages)
    after = counts(prefix_health(gateway))
    outcomes = {k: sum(c[k] for c in after.values()) - sum(c[k] for c in before.values()) for k in OUTCOMES}
    assert outcomes == {"exact": 2, "over": 0, "under": 0}, after


def test_a_prompt_sent_again_is_predicted_in_whole_engine_blocks(gateway: RunningProcess) -> None:
    """A prompt sent twice, then its next turn at once: the replica reuses whole engine blocks of its cache only
    (vLLM's are 128 tokens on a CPU), and the prediction counts whole engine blocks too, what was just sent
    included. The prompt (760 tokens) ends with a whole 64-token gateway block in an engine block it never fills,
    and sent again it stores nothing new: no event tells the gateway about those blocks within the next turn."""
    prompt, next_turn = conversation(100, 2), conversation(100, 3)
    before = counts(prefix_health(gateway))
    for messages in (prompt, prompt, next_turn):
        ask(gateway, messages)
    after = counts(prefix_health(gateway))
    outcomes = {k: sum(c[k] for c in after.values()) - sum(c[k] for c in before.values()) for k in OUTCOMES}
    assert outcomes == {"exact": 3, "over": 0, "under": 0}, after


def test_a_restarted_replica_is_cleared(replicas: Replicas, tmp_path: Path) -> None:
    """Last in the module. The replica restarts on the same ports: its event numbers start again, the gateway
    drops what the old process held and predicts nothing for a prompt it held, exactly as the replica reports;
    then it follows the new process's events from the first."""
    gateway, a = kv_gateway(replicas, ["a"], tmp_path), replicas.name("a")
    try:
        followed = wait_for(
            gateway, "a followed", lambda seen: seen[a]["source"] == "events", poke=lambda: ask(gateway, POKE)
        )
        start = counts(followed)[a]
        messages = conversation(60, 2)
        ask(gateway, messages)
        warm = ask(gateway, messages)
        assert warm.reason == "prefix_hit" and warm.cached_tokens >= HELD, warm
        before = prefix_health(gateway)
        assert since(start, counts(before)[a]) == {"exact": 2, "over": 0, "under": 0}, before

        restarting = time.monotonic()
        replicas.restart("a")
        print(f"restarted in {time.monotonic() - restarting:.0f} s")
        deadline = time.monotonic() + 30
        while not httpx.get(gateway.url + "/health", timeout=30).json()["backends"][a]["healthy"]:
            assert time.monotonic() < deadline, "the restarted replica never came back"
            time.sleep(0.2)
        cold = ask(gateway, messages)
        assert cold.cached_tokens < BLOCK, cold
        old_seq = before[a]["events"]["last_seq"]
        seen = wait_for(
            gateway,
            "the new process's events followed from its first batch",
            # (the gateway may also follow it anew, having read the new process's description)
            lambda seen: seen[a].get("events", {}).get("last_seq") in range(old_seq) and seen[a]["events"]["complete"],
            seconds=10,
        )
        assert seen[a]["source"] == "events", seen
        again = ask(gateway, messages)
        assert again.reason == "prefix_hit" and again.cached_tokens >= HELD, again
        after = since(start, counts(prefix_health(gateway))[a])
        assert cold.reason != "prefix_hit", cold
        assert after == {"exact": 4, "over": 0, "under": 0}, after
    finally:
        gateway.stop()
