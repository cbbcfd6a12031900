"""The Dockerfile and deploy/compose.yaml built and run by a real Docker daemon, as a user would: the image on
the demo config, then the compose stack. Opt-in (SPILLGATE_DOCKER_TESTS=1) and skipped without a daemon: a first
build takes minutes and needs the base images, so `make test` never runs these.

    SPILLGATE_DOCKER_TESTS=1 .venv/bin/python -m pytest tests/deploy/test_docker_live.py -v
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import yaml
from openai import OpenAI

from tests.deploy.docker_cli import (
    compose_command,
    docker,
    inspect,
    project_containers,
    runnable_compose,
    wait_healthy,
    why_not_live,
)
from tests.deploy.support import DEPLOY, REPO
from tests.support.procs import free_port

SKIP = why_not_live()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

IMAGE = os.environ.get("SPILLGATE_DOCKER_IMAGE", "spillgate:local")  # the tag deploy/compose.yaml runs
DEMO_KEY = "sk-spillgate-demo"
HARD_PROMPT = (
    "Prove that there are infinitely many primes congruent to 3 mod 4, derive their density with Dirichlet "
    "characters, then write a segmented sieve in Rust and analyse its cache behaviour step by step."
)


@pytest.fixture(scope="module")
def image() -> str:
    docker("build", "-t", IMAGE, str(REPO), timeout=1800)
    return IMAGE


def client(port: int) -> OpenAI:
    return OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=DEMO_KEY, max_retries=0, timeout=60)


class StreamInFlight(threading.Thread):
    """A long stream, so that a stop arrives while it runs; ``started`` once its first chunk is in."""

    def __init__(self, port: int, max_tokens: int = 1500) -> None:
        super().__init__(daemon=True)
        self.port, self.max_tokens = port, max_tokens
        self.started = threading.Event()
        self.finish_reason: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            messages = [{"role": "user", "content": "a long answer, please"}]
            stream = client(self.port).chat.completions.create(
                model="llama-3.1-8b", messages=messages, max_tokens=self.max_tokens, stream=True
            )
            for chunk in stream:
                self.started.set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    self.finish_reason = chunk.choices[0].finish_reason
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc
        finally:
            self.started.set()


def started_stream(port: int) -> StreamInFlight:
    stream = StreamInFlight(port)
    stream.start()
    assert stream.started.wait(60) and stream.error is None, stream.error
    return stream


def test_the_image_serves_the_demo_as_its_user_and_drains_on_stop(image: str) -> None:
    name, volume, port = f"spillgate-live-{uuid.uuid4().hex[:8]}", f"spillgate-live-{uuid.uuid4().hex[:8]}", free_port()
    demo = REPO / "config" / "demo.yaml"
    # As the Kubernetes base runs it: read-only root, /tmp and the state directory writable, no capabilities.
    docker(
        "run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8080", "--stop-timeout", "40",
        "-v", f"{demo}:/etc/spillgate/config.yaml:ro", "-v", f"{volume}:/var/lib/spillgate",
        "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges", image,
    )  # fmt: skip
    try:
        wait_healthy(name, timeout=120)
        api = client(port)
        assert {"llama-3.1-8b", "auto", "frontier"} <= {m.id for m in api.models.list().data}
        raw = api.chat.completions.with_raw_response.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=8
        )
        assert raw.parse().choices[0].message.content
        assert raw.headers["x-spillgate-backend"].startswith("llama-8b")
        processes = docker("top", name, "-eo", "pid,uid").stdout.splitlines()[1:]
        assert processes and {line.split()[1] for line in processes} == {"10001"}, processes

        stream = started_stream(port)
        began = time.monotonic()
        docker("stop", "-t", "40", name, timeout=60)
        stream.join(10)
        assert stream.error is None and stream.finish_reason == "length", stream.error
        assert time.monotonic() - began < 40
        assert inspect(name)["State"]["ExitCode"] == 0

        ledger = "stat -c '%u %n' /v/*/ledger.sqlite3"  # the demo's default data directory, on the volume
        state = docker("run", "--rm", "-v", f"{volume}:/v", "--entrypoint", "sh", image, "-c", ledger)
        assert state.stdout.startswith("10001 /v/"), state.stdout
    finally:
        docker("rm", "-f", name, check=False)
        docker("volume", "rm", volume, check=False)


@pytest.fixture(scope="module")
def stack(image: str) -> Iterator[dict[str, Any]]:
    """deploy/compose.yaml up, every service it could get an image for healthy; down with its volumes after."""
    command = compose_command()
    if command is None:
        pytest.skip("neither docker compose nor docker-compose")
    doc, ports, missing = runnable_compose(DEPLOY / "compose.yaml", legacy=command == ["docker-compose"])
    project = f"spillgate-live-{uuid.uuid4().hex[:8]}"
    compose = [*command, "-p", project, "-f", "-"]
    text = yaml.safe_dump(doc)

    def run(*args: str, timeout: float = 300) -> None:
        done = subprocess.run([*compose, *args], input=text, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout}\n{done.stderr}"

    try:
        run("up", "-d")
        for service, container in project_containers(project).items():
            wait_healthy(container["Id"], timeout=120 if service == "gateway" else 60)
        yield {"project": project, "ports": ports, "missing": missing, "run": run}
    finally:
        subprocess.run([*compose, "down", "-v"], input=text, capture_output=True, text=True, timeout=300)


def test_the_stack_routes_to_replicas_and_spills_to_the_hosted_model(stack: dict[str, Any]) -> None:
    port = stack["ports"][8080]
    api = client(port)

    def backend(i: int) -> str:
        raw = api.chat.completions.with_raw_response.create(
            model="chat", messages=[{"role": "user", "content": f"question {i} " * 40}], max_tokens=200
        )
        return raw.headers["x-spillgate-backend"]

    with ThreadPoolExecutor(24) as pool:  # at once, so that load spreads them over both pools
        backends = set(pool.map(backend, range(24)))
    assert {b.partition("/")[0] for b in backends} == {"llama-8b", "llama-8b-vllm"}, backends
    spilled = api.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": HARD_PROMPT}], max_tokens=8
    )
    assert (spilled.headers["x-spillgate-backend"], spilled.headers["x-spillgate-reason"]) == ("frontier", "complex")
    assert spilled.parse().model == "frontier-large"

    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'spillgate_kv_events_lag_seconds{backend="llama-8b/replica-0:30000"}' in metrics  # across the network
    redis = project_containers(stack["project"])["redis"]["Id"]
    assert int(docker("exec", redis, "redis-cli", "dbsize").stdout) > 0


def test_prometheus_scrapes_every_target(stack: dict[str, Any]) -> None:
    if "prometheus" in stack["missing"]:
        pytest.skip("no Prometheus image here")
    url = f"http://127.0.0.1:{stack['ports'][9090]}/api/v1/targets"
    deadline = time.monotonic() + 60
    while True:
        targets = json.loads(urllib.request.urlopen(url, timeout=10).read())["data"]["activeTargets"]
        health = {t["labels"]["instance"]: t["health"] for t in targets}
        if health and set(health.values()) == {"up"}:
            break
        assert time.monotonic() < deadline, health
        time.sleep(2)
    assert {"gateway:8080", "replica-0:30000", "replica-1:30000", "replica-vllm:8000"} <= set(health)


def test_grafana_serves_the_shipped_dashboard(stack: dict[str, Any]) -> None:
    if "grafana" in stack["missing"]:
        pytest.skip("no Grafana image here")
    url = f"http://127.0.0.1:{stack['ports'][3000]}/api/search?type=dash-db"
    deadline = time.monotonic() + 60
    while True:
        try:
            found = json.loads(urllib.request.urlopen(url, timeout=10).read())
        except OSError:
            found = []
        if found:
            break
        assert time.monotonic() < deadline, "Grafana lists no dashboard"
        time.sleep(2)
    assert any("spillgate" in d["title"].lower() for d in found), found


def test_stopping_the_stack_drains_streams_and_every_service_exits_cleanly(stack: dict[str, Any]) -> None:
    stream = started_stream(stack["ports"][8080])
    stack["run"]("stop", timeout=120)
    stream.join(10)
    assert stream.error is None and stream.finish_reason == "length", stream.error
    exits = {service: c["State"]["ExitCode"] for service, c in project_containers(stack["project"]).items()}
    assert set(exits.values()) == {0}, exits
