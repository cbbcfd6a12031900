"""Running a real gateway process over a config a test writes."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx
import openai
import pytest
import yaml
from openai.types import CompletionUsage

from spillgate.gateway.control.config import RECOMMENDED_SGLANG_FLAGS
from spillgate.gateway.control.replica_names import configured_name
from tests.support.procs import RunningProcess, free_port, start_process, start_spillgate

TENANT_KEY = "sk-test-tenant"
OTHER_KEY = "sk-test-other"


def gateway_config(replica_urls: list[str], **overrides: Any) -> dict[str, Any]:
    """A config with one pool over ``replica_urls``, routes ``chat`` (least_load) and ``chat-rr``."""
    config: dict[str, Any] = {
        "pools": [{"name": "pool", "served_model": "sim-model", "replicas": replica_urls}],
        "routes": [
            {"name": "chat", "targets": ["pool"], "policy": "least_load"},
            {"name": "chat-rr", "targets": ["pool"], "policy": "round_robin"},
        ],
        "tenants": [
            {"name": "tenant-a", "keys": [TENANT_KEY]},
            {"name": "tenant-b", "keys": [OTHER_KEY], "routes": ["chat-rr"]},
        ],
        "health": {"interval_s": 0.2, "timeout_s": 1.0, "unhealthy_after": 1},
    }
    config.update(overrides)
    return config


def replica_name(replica: str | RunningProcess, pool: str = "pool") -> str:
    """The name the gateway gives the configured replica at ``replica`` (a URL, or a running one) in ``pool``:
    ``pool/host:port``, as headers, metrics, the access log and the admin API show it."""
    return configured_name(pool, replica if isinstance(replica, str) else replica.url)


def pool_of(backend: str) -> str:
    """The pool of a configured or discovered replica by its name (``pool/...``); a hosted model's name is its own.
    For a pool of one replica that a fixture keeps to itself."""
    return backend.partition("/")[0]


def start_gateway(config: dict[str, Any], tmp_path: Path, *, ready_path: str = "/health") -> RunningProcess:
    port = free_port()
    config = {**config, "state": {"data_dir": str(tmp_path / f"data-{port}"), **config.get("state", {})}}
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"gateway-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    return start_spillgate(
        ["serve", "--config", str(path), "--port", str(port)], port=port, log_dir=tmp_path, ready_path=ready_path
    )


def start_replica(tmp_path: Path, *args: str, port: int | None = None, bare: bool = False) -> RunningProcess:
    """A simulated SGLang replica with the recommended flags (``bare``: on SGLang's own defaults)."""
    port = port or free_port()
    flags = () if bare else RECOMMENDED_SGLANG_FLAGS
    vllm = "--engine" in args and args[args.index("--engine") + 1] == "vllm"
    return start_spillgate(
        ["sim-replica", "--port", str(port), "--model-name", "sim-model", *flags, *args],
        port=port,
        log_dir=tmp_path,
        ready_path="/health" if vllm else "/ready",  # vLLM has no /ready; SGLang's /health runs a generation
    )


def start_lying_replica(log_dir: Path, mode: str) -> RunningProcess:
    """A replica that passes every probe and fails every request, the ``mode`` way of
    :mod:`tests.gateway.lying_replica`."""
    port = free_port()
    command = [sys.executable, "-m", "tests.gateway.lying_replica", "--port", str(port), "--mode", mode]
    return start_process(command, port=port, log_dir=log_dir, ready_path="/ready", timeout=30, name=f"liar-{mode}")


def running_replicas(log_dir: Path, count: int, *args: str) -> Iterator[list[RunningProcess]]:
    """``count`` simulated replicas started with ``args``, for a fixture to ``yield from``: all stop when the
    generator is closed, and those already started stop when a later one fails to start."""
    started: list[RunningProcess] = []
    try:
        for _ in range(count):
            started.append(start_replica(log_dir, *args))
        yield started
    finally:
        for proc in started:
            proc.stop()


def gateway_over_one_replica(
    log_dir: Path, edit: Callable[[dict[str, Any]], None], *replica_args: str
) -> Iterator[RunningProcess]:
    """A gateway (the :func:`gateway_config` changed by ``edit``) in front of one simulated replica started with
    ``replica_args``, for a fixture to ``yield from``. Stops both when the generator is closed."""
    replica = start_replica(log_dir, *replica_args)
    try:
        config = gateway_config([replica.url])
        edit(config)
        gateway = start_gateway(config, log_dir)
        try:
            yield gateway
        finally:
            gateway.stop()
    finally:
        replica.stop()


def serve_one_slow_replica(log_dir: Path, edit: Callable[[dict[str, Any]], None]) -> Iterator[RunningProcess]:
    """A gateway (its config changed by ``edit``) in front of one simulated 8B replica at a third of real
    speed, where a 6k-token prefill takes about half a second: long enough for requests to queue behind it.
    Stops both when the generator is closed."""
    yield from gateway_over_one_replica(log_dir, edit, "--preset", "llama-3.1-8b-h100", "--time-scale", "3")


class StreamReader(Protocol):
    """A thread reading one streamed answer that sets ``started`` once tokens flow (or once it has ended)."""

    started: threading.Event

    def start(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


def kill_while_streaming(gateway: RunningProcess, streams: Sequence[StreamReader]) -> None:
    """Start ``streams`` and, once tokens flow on each, kill the gateway outright (SIGKILL: it books nothing on the
    way out); returns when every stream has seen its connection cut."""
    for stream in streams:
        stream.start()
    for stream in streams:
        assert stream.started.wait(30)
    gateway.popen.kill()
    gateway.popen.wait(timeout=10)
    for stream in streams:
        stream.join(10)


def words(tag: str, count: int) -> str:
    """A prompt of ``count`` distinct words that shares no prefix with another tag's."""
    return " ".join(f"{tag}{i}" for i in range(count))


def streamed_usage(client: openai.OpenAI, model: str, messages: list[dict[str, str]]) -> CompletionUsage:
    """The usage of one streamed answer (the stream read to its end)."""
    chunks = client.chat.completions.create(
        model=model, messages=messages, max_tokens=2, stream=True, stream_options={"include_usage": True}
    )  # type: ignore[arg-type]
    usages = [chunk.usage for chunk in chunks if chunk.usage is not None]
    return usages[-1]


def hang_up_while_held(gateway: RunningProcess, model: str, messages: list[dict[str, str]]) -> None:
    """Send a streamed request and hang up when nothing has come back within 0.1 s, as it must not while held."""
    body = {"model": model, "messages": messages, "max_tokens": 2, "stream": True}
    headers = {"authorization": f"Bearer {TENANT_KEY}"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=httpx.Timeout(5, read=0.1))
