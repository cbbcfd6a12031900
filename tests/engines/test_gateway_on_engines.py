"""The gateway in front of each world's replicas (real SGLang, real vLLM, the simulator), through the ``openai`` SDK.

The same test bodies run in every world and expect the same answers: where the simulator claims to model an
engine, it must behave as the real one does here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.engines.worlds import WORLDS, World, make_world
from tests.support.gateway import TENANT_KEY, gateway_config, replica_name, start_gateway
from tests.support.procs import RunningProcess, free_port


@pytest.fixture(scope="module", params=WORLDS)
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    yield from make_world(request.param)


@dataclass
class Listener:
    """A KV-event subscriber and where it writes what it hears."""

    flags: tuple[str, ...]
    out: Path
    process: subprocess.Popen[bytes] | None = None

    def records(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line]


@pytest.fixture(scope="module")
def kv_listener(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listener]:
    """The engine's own Python listens to a real engine; the gateway's (which has pyzmq and msgspec too) to the
    simulator, which publishes and binds as the engine whose face it wears."""
    out = tmp_path_factory.mktemp(f"{world.name}-kv") / "events.jsonl"
    from tests.engines.capture import kv_events_flags

    flags, endpoint, bind = kv_events_flags(world.engine, free_port())
    python = world.python or Path(sys.executable)
    command = [str(python), str(Path(__file__).with_name("kv_listen.py")), endpoint, str(out)]
    listener = Listener(flags, out, subprocess.Popen([*command, *(["--bind"] if bind else [])], start_new_session=True))
    yield listener
    assert listener.process is not None
    listener.process.send_signal(signal.SIGTERM)
    listener.process.wait(10)


@pytest.fixture(scope="module")
def pair(world: World, kv_listener: Listener, tmp_path_factory: pytest.TempPathFactory) -> list[RunningProcess]:
    """Two replicas started with the flags the README recommends, in parallel (a real engine takes a minute); the
    first also publishes its KV events."""
    log_dir = tmp_path_factory.mktemp(f"{world.name}-pair")
    flags = [(*world.recommended, *kv_listener.flags), world.recommended]
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda f: world.replica(log_dir, *f), flags))


@pytest.fixture(scope="module")
def plain(world: World, tmp_path_factory: pytest.TempPathFactory) -> RunningProcess:
    """A replica on the engine's own defaults, behind an API key."""
    return world.replica(tmp_path_factory.mktemp(f"{world.name}-plain"), "--api-key", REPLICA_KEY)


REPLICA_KEY = "sk-replica-secret"


QUICK_HEALTH = {"interval_s": 0.25, "timeout_s": 1.0, "unhealthy_after": 2, "generation_check_s": 5}
"""Probes that take a hung replica out within seconds."""

PATIENT_HEALTH = {**QUICK_HEALTH, "timeout_s": 10.0}
"""Probes for tests about something else: on a small machine an idle replica's server, starved of CPU by its
busy sibling, can take over a second to answer, and a quick gateway rightly takes it out meanwhile."""


def world_gateway(
    world: World, urls: list[str], log_dir: Path, health: dict[str, Any] = QUICK_HEALTH, **pool: Any
) -> RunningProcess:
    config = gateway_config([])
    config["pools"] = [world.pool(urls, **pool)]
    config["routes"].append({"name": "aware", "targets": ["pool"], "policy": "cache_aware"})
    config["health"] = health
    return start_gateway(config, log_dir)


@pytest.fixture(scope="module")
def gateway(
    world: World, pair: list[RunningProcess], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProcess]:
    proc = world_gateway(world, [r.url for r in pair], tmp_path_factory.mktemp(f"{world.name}-gateway"))
    yield proc
    proc.stop()


def client(gateway: RunningProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0, timeout=120)


def words(tag: str, count: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(count))


EXACT = {"ignore_eos": True}
"""The tiny model's weights are random: without this it may end a reply at any token."""


def chat(gateway: RunningProcess, model: str, content: str, max_tokens: int = 4) -> tuple[str, str, Any]:
    raw = client(gateway).chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=max_tokens, extra_body=EXACT
    )
    return raw.headers["x-spillgate-backend"], raw.headers["x-spillgate-reason"], raw.parse()


def health(gateway: RunningProcess) -> dict[str, Any]:
    return httpx.get(gateway.url + "/health", timeout=5).json()["backends"]


def test_chat_and_completions_streamed_and_not(gateway: RunningProcess) -> None:
    sdk = client(gateway)
    backend, _, answer = chat(gateway, "chat", "Say something.", max_tokens=6)
    assert backend.startswith("pool/")
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == 6 and answer.usage.prompt_tokens > 3

    chunks = list(
        sdk.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "Stream something."}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=EXACT,
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].choices == []
    assert any(c.choices and c.choices[0].finish_reason == "length" for c in chunks)

    text = sdk.completions.create(model="chat", prompt="Once upon a time", max_tokens=5, extra_body=EXACT)
    assert text.usage.completion_tokens == 5 and text.choices[0].finish_reason == "length"
    streamed = list(
        sdk.completions.create(
            model="chat",
            prompt="Once upon a time",
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=EXACT,
        )
    )
    assert streamed[-1].usage.completion_tokens == 5
    assert "".join(c.choices[0].text for c in streamed if c.choices)


def test_cached_tokens_come_back_and_feed_the_index(gateway: RunningProcess, world: World) -> None:
    prefix = words("feed", 600)
    first, _, cold = chat(gateway, "aware", prefix + " first")
    assert cold.usage.prompt_tokens_details is not None, "the recommended flags report cached tokens"
    assert cold.usage.prompt_tokens_details.cached_tokens < cold.usage.prompt_tokens / 2
    second, reason, warm = chat(gateway, "aware", prefix + " second")
    assert (second, reason) == (first, "prefix_hit")
    assert warm.usage.prompt_tokens_details.cached_tokens > 0.8 * warm.usage.prompt_tokens
    backends = health(gateway)
    assert backends[first]["capabilities"]["cache_report"] is True
    assert backends[first]["degraded"] == []
    metrics = httpx.get(gateway.url + "/metrics").text
    cached = [
        line
        for line in metrics.splitlines()
        if line.startswith(f'spillgate_prompt_tokens_total{{backend="{first}",kind="cached"}}')
    ]
    assert cached and float(cached[0].split()[-1]) >= warm.usage.prompt_tokens_details.cached_tokens


def test_prefixes_stay_on_the_replica_that_holds_them(gateway: RunningProcess) -> None:
    homes: dict[str, str] = {}
    for group in ("alpha", "beta", "gamma", "delta"):
        homes[group], _, _ = chat(gateway, "aware", words(group, 500) + " q0")
    assert len(set(homes.values())) == 2, f"four new prefixes, balanced over both replicas: {homes}"
    for round_ in range(2):
        for group, home in homes.items():
            backend, reason, answer = chat(gateway, "aware", words(group, 500) + f" q{round_ + 1}")
            assert (backend, reason) == (home, "prefix_hit")
            assert answer.usage.prompt_tokens_details.cached_tokens > 0.8 * answer.usage.prompt_tokens


@pytest.fixture
def patient_gateway(world: World, pair: list[RunningProcess], tmp_path: Path) -> Iterator[RunningProcess]:
    proc = world_gateway(world, [r.url for r in pair], tmp_path, health=PATIENT_HEALTH)
    yield proc
    proc.stop()


def test_replica_load_is_scraped_and_steers_new_requests(
    patient_gateway: RunningProcess, pair: list[RunningProcess]
) -> None:
    """Another client's long generations on one replica show in its scraped load; least_load avoids it."""
    gateway = patient_gateway
    stop = threading.Event()

    def other_client() -> None:
        """Long streams, one after another (a slow machine may reach the replica's context length before the
        test is done), the last abandoned (which aborts it on the replica) once the test is done."""
        body = {"model": "tiny", "messages": [{"role": "user", "content": "busy"}], "max_tokens": 8000, "stream": True}
        while not stop.is_set():
            url = pair[0].url + "/v1/chat/completions"
            with httpx.stream("POST", url, json={**body, **EXACT}, timeout=300) as reply:
                for _ in reply.iter_lines():
                    if stop.is_set():
                        return

    threads = [threading.Thread(target=other_client) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        # Three long streams on a 2-core machine starve every process of CPU, the gateway's scrapes and this
        # test's reads of /metrics included (single reads were seen to take 19 s): allow a minute.
        deadline = time.monotonic() + 60
        while True:
            running = _gauge(gateway, "spillgate_backend_running_requests", replica_name(pair[0]))
            if running >= 2:
                break
            assert time.monotonic() < deadline, "the replica's running requests never showed in the gateway"
            time.sleep(0.2)
        chosen = {chat(gateway, "chat", f"steer {i}")[0] for i in range(4)}
        assert chosen == {replica_name(pair[1])}
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def _gauge(gateway: RunningProcess, name: str, backend: str) -> float:
    for line in httpx.get(gateway.url + "/metrics").text.splitlines():
        if line.startswith(f'{name}{{backend="{backend}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_a_replica_in_a_long_prefill_stays_in_rotation_and_a_hung_one_leaves(
    gateway: RunningProcess, pair: list[RunningProcess], world: World
) -> None:
    busy, hung = replica_name(pair[0]), replica_name(pair[1])
    # Three long prompts sharing nothing, prefilled one after another (vLLM on a CPU prefills one in ~1.5 s).
    prompts = [_prompt_of(world, int(world.context * 0.6), tag) for tag in ("p", "q", "r")]

    def long_prefill(prompt: str) -> None:
        body = {"model": "tiny", "messages": [{"role": "user", "content": prompt}], "max_tokens": 1}
        httpx.post(pair[0].url + "/v1/chat/completions", json=body, timeout=300)

    threads = [threading.Thread(target=long_prefill, args=(prompt,)) for prompt in prompts]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads) and time.monotonic() - started < 90:
        assert health(gateway)[busy]["healthy"], "a busy replica was taken out of rotation"
        time.sleep(0.2)
    for thread in threads:
        thread.join()
    assert health(gateway)[busy]["healthy"]
    if world.real:
        # Long enough that probes waiting on it would have timed out (1 s each, two in a row) several times.
        assert time.monotonic() - started > 2.5, "the prefill was too short to prove anything"

    os.killpg(pair[1].pid, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        while health(gateway)[hung]["healthy"]:
            assert time.monotonic() - stopped < 5, "a hung replica stayed in rotation"
            time.sleep(0.1)
        assert {chat(gateway, "chat", f"while hung {i}")[0] for i in range(3)} == {busy}
    finally:
        os.killpg(pair[1].pid, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while not health(gateway)[hung]["healthy"]:
        assert time.monotonic() < deadline, "the replica never came back"
        time.sleep(0.2)
    assert health(gateway)[hung]["last_error"] is None, "an old probe failure is not the replica's state now"


def _prompt_of(world: World, tokens: int, tag: str = "p") -> str:
    """Words making about ``tokens`` tokens on the world's tokenizer (a little under), sharing no prefix with
    another ``tag``'s."""
    sample = words(tag, 200)
    per_word = world.count_tokens(sample) / 200
    return words(tag, int(tokens / per_word * 0.95))


def test_engine_errors_reach_the_client_in_openai_format(gateway: RunningProcess, world: World) -> None:
    sdk = client(gateway)
    too_long = _prompt_of(world, int(world.context * 1.3))
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model="chat", messages=[{"role": "user", "content": too_long}], max_tokens=4)
    error = refused.value.body
    assert isinstance(error, dict) and error["type"] == "invalid_request_error" and error["message"]
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], temperature=-1)
    assert "temperature" in bad.value.body["message"], "the engine's own reason reaches the client"
    assert "pool/" not in bad.value.body["message"], "replica names stay in the gateway's log"


def test_a_replica_behind_an_api_key(world: World, plain: RunningProcess, tmp_path: Path) -> None:
    os.environ["SPILLGATE_TEST_REPLICA_KEY"] = REPLICA_KEY
    good = world_gateway(world, [plain.url], tmp_path / "good", api_key="os.environ/SPILLGATE_TEST_REPLICA_KEY")
    bad = world_gateway(world, [plain.url], tmp_path / "bad", api_key="sk-not-the-key")
    try:
        backend, _, answer = chat(good, "chat", "hello behind a key")
        assert backend == replica_name(plain) and answer.usage.completion_tokens == 4
        assert health(good)[backend]["capabilities"]["context_window"] == world.context, "probes carry the key"
        with pytest.raises(openai.APIStatusError) as refused:
            chat(bad, "chat", "hello with the wrong key")
        assert refused.value.status_code == 502 and refused.value.body["code"] == "backend_auth"
    finally:
        good.stop()
        bad.stop()


def test_a_replica_on_its_defaults_works_and_says_what_it_lacks(
    world: World, plain: RunningProcess, tmp_path: Path
) -> None:
    gateway = world_gateway(world, [plain.url], tmp_path / "gw", api_key=REPLICA_KEY)
    try:
        backend, _, answer = chat(gateway, "aware", words("plain", 300))
        assert backend == replica_name(plain)
        assert answer.usage.prompt_tokens_details is None
        reported = health(gateway)[backend]
        assert reported["capabilities"]["cache_report"] is False
        assert any(world.recommended[-1] in d for d in reported["degraded"]), reported["degraded"]
        if world.engine == "sglang":
            assert any("--enable-metrics" in d for d in reported["degraded"])
            assert reported["capabilities"]["max_running"], "the effective running limit, not the null flag"
    finally:
        gateway.stop()


def test_kv_events_from_the_real_publisher(world: World, pair: list[RunningProcess], kv_listener: Listener) -> None:
    """The engine's ZMQ publisher announces the blocks a prompt stored, with its token ids; the simulator's, as
    the engine whose face it wears does."""
    deadline = time.monotonic() + 30
    stored: list[dict[str, Any]] = []
    attempt = 0
    while not stored and time.monotonic() < deadline:
        # A new prompt each time: the first may be published before the listener's subscription is in place,
        # and the same prompt again stores nothing new.
        attempt += 1
        body = {"model": "tiny", "prompt": words(f"event{attempt}", 300), "max_tokens": 2}
        httpx.post(pair[0].url + "/v1/completions", json=body, timeout=60).raise_for_status()
        time.sleep(1.0)
        records = kv_listener.records()
        stored = [e for r in records if "batch" in r for e in _events(r["batch"]) if e.get("type") == "BlockStored"]
    assert stored, "no BlockStored event arrived"
    tokens = [t for e in stored for t in e["token_ids"]]
    assert len(tokens) >= 300
    assert all(isinstance(h, int) for e in stored for h in e["block_hashes"])


def test_a_restarted_replica_starts_with_an_empty_index(
    world: World, pair: list[RunningProcess], tmp_path: Path
) -> None:
    """Last in the module: it replaces the second replica of the pair by a new process on the same port."""
    port, name = int(pair[1].url.rsplit(":", 1)[1]), replica_name(pair[1])  # the same again on the same port
    gateway = world_gateway(world, [pair[1].url], tmp_path / "gw")
    try:
        prefix = words("restart", 500)
        chat(gateway, "aware", prefix + " one")
        assert chat(gateway, "aware", prefix + " two")[1] == "prefix_hit"
        pair[1].stop()
        _wait_health(gateway, name, healthy=False)
        pair[1] = world.replica(tmp_path, *world.recommended, port=port)
        _wait_health(gateway, name, healthy=True, seconds=60)
        _, reason, answer = chat(gateway, "aware", prefix + " three")
        assert reason != "prefix_hit", "the index forgot what the old process held"
        assert answer.usage.prompt_tokens_details.cached_tokens < answer.usage.prompt_tokens / 2
    finally:
        gateway.stop()


def _wait_health(gateway: RunningProcess, name: str, *, healthy: bool, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while health(gateway)[name]["healthy"] != healthy:
        assert time.monotonic() < deadline, f"{name} never became healthy={healthy}"
        time.sleep(0.1)


def _events(batch: Any) -> list[dict[str, Any]]:
    """A batch is ``[timestamp, events, rank]`` (both engines encode it as an array); each event a tagged map."""
    events = batch[1] if isinstance(batch, list) else batch.get("events", [])
    return [e for e in events if isinstance(e, dict)]
