"""``spillgate serve``: the embedded demo from a bare command, and config validation that fails fast."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import anthropic
import httpx
import openai
import yaml

from tests.support.procs import REPO_ROOT, RunningProcess, free_port, start_spillgate


def test_demo_serves_openai_clients_and_stops_its_simulators(tmp_path: Path) -> None:
    port = free_port()
    gateway = start_spillgate(
        ["serve", "--port", str(port)], port=port, log_dir=tmp_path, ready_path="/ready", timeout=60
    )
    try:
        banner = gateway.log()
        assert f"http://127.0.0.1:{port}/v1" in banner and "data directory:" in banner
        assert "sk-spillgate-demo" in banner
        assert "pool llama-8b: llama-8b-0 (http://127.0.0.1:" in banner, "replicas by the names metrics use"
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-spillgate-demo", max_retries=0)
        assert {m.id for m in client.models.list()} >= {"llama-3.1-8b", "frontier"}

        reply = client.chat.completions.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": "Say hi"}], max_tokens=5
        )
        assert reply.usage.completion_tokens == 5
        streamed = client.chat.completions.create(
            model="frontier", messages=[{"role": "user", "content": "Say hi"}], max_tokens=5, stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        # The demo's replicas parse tool calls, as a real replica started with its tool-call parser does.
        weather = {
            "type": "function",
            "function": {
                "name": "weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
        called = client.chat.completions.create(
            model="llama-3.1-8b",
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[weather],  # type: ignore[list-item]
            tool_choice="required",
            max_tokens=64,
        )
        assert called.choices[0].finish_reason == "tool_calls"
        call = called.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert call.function.name == "weather" and "city" in json.loads(call.function.arguments)
        # Embeddings, from the demo's embeddings pool; the Responses and Messages APIs over the same routes.
        vectors = client.embeddings.create(model="embed", input=["first text", "second text"])
        assert len(vectors.data) == 2 and vectors.usage.prompt_tokens > 0
        assert client.responses.create(model="llama-3.1-8b", input="Say hi", max_output_tokens=5).output_text
        claude_style = anthropic.Anthropic(base_url=gateway.url, api_key="sk-spillgate-demo", max_retries=0)
        message = claude_style.messages.create(
            model="llama-3.1-8b", max_tokens=5, messages=[{"role": "user", "content": "Say hi"}]
        )
        assert message.content[0].type == "text" and message.usage.output_tokens == 5

        health = httpx.get(gateway.url + "/health").json()
        assert len([name for name in health["backends"] if name.startswith("llama-8b-")]) == 4
        children = child_pids(gateway.pid)
        assert len(children) == 6  # four chat replicas, the embeddings replica, the hosted model
    finally:
        gateway.stop()
    assert not [pid for pid in children if alive(pid)], "simulators must stop with the gateway"


def test_invalid_config_fails_fast_with_the_field_path(tmp_path: Path) -> None:
    config = yaml.safe_load((REPO_ROOT / "config" / "demo.yaml").read_text())
    config["routes"][0]["policy"] = "fastest-please"
    config["listen"]["port"] = "eighty"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [sys.executable, "-m", "spillgate.gateway.cli", "serve", "--config", str(path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert str(path) in result.stderr
    assert "routes.0.policy" in result.stderr and "round_robin" in result.stderr
    assert "listen.port" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_target_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"routes": [{"name": "r", "targets": ["ghost"]}], "auth": {"required": False}}))
    result = run_serve(path)
    assert result.returncode == 2 and "ghost" in result.stderr
    result = run_serve(tmp_path / "absent.yaml")
    assert result.returncode == 2 and "absent.yaml" in result.stderr and "Traceback" not in result.stderr
    for port in ("99999", "-1", "http"):
        done = subprocess.run(
            [sys.executable, "-m", "spillgate.gateway.cli", "serve", "--port", port],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and "--port" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_an_unreadable_tokenizer_fails_fast(tmp_path: Path) -> None:
    config = yaml.safe_load((REPO_ROOT / "config" / "demo.yaml").read_text())
    config["prefix"] = {"tokenizer": str(tmp_path / "missing-tokenizer.json")}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_serve(path)
    assert result.returncode == 2
    assert "prefix.tokenizer: cannot load" in result.stderr and "missing-tokenizer.json" in result.stderr
    assert "Traceback" not in result.stderr


def run_serve(path: Path) -> subprocess.CompletedProcess[str]:
    # The simulators start while the config is checked, and a refused config stops them: slow on a busy machine.
    return subprocess.run(
        [sys.executable, "-m", "spillgate.gateway.cli", "serve", "--config", str(path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def child_pids(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}/stat").exists() else ""
    return bool(stat) and stat.split()[2] != "Z"


def test_an_idle_keep_alive_connection_outlives_uvicorns_default(gateway: RunningProcess) -> None:
    """A client pool reusing an idle connection must find it open: uvicorn closes one after 5 s by default, and a
    reuse racing that close is a connection reset on the client's side. The gateway keeps them 75 s."""
    host, port = gateway.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("GET", "/health")
        assert conn.getresponse().read() and conn.sock is not None
        first = conn.sock
        time.sleep(6)
        conn.request("GET", "/health")  # on the same socket: http.client reconnects only once it is closed
        response = conn.getresponse()
        assert response.status == 200 and response.read()
        assert conn.sock is first, "the gateway closed an idle keep-alive connection"
    finally:
        conn.close()


def test_a_hosted_model_without_a_price_fails_fast_with_the_field_path(tmp_path: Path) -> None:
    hosted = {"name": "frontier", "model": "openai/no-such-model", "api_key": "sk-x"}
    routes = [{"name": "r", "targets": ["frontier"]}]
    config = {"hosted_models": [hosted], "routes": routes, "auth": {"required": False}}
    path = tmp_path / "unpriced.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_serve(path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "hosted_models.0.model" in result.stderr and "set input_per_mtok" in result.stderr


SPAWN_WATCH = """
import sys
def watch(event, args):
    if event == "subprocess.Popen":
        print("SPAWNED", args[1], file=sys.stderr, flush=True)
sys.addaudithook(watch)
from spillgate.gateway.cli import main
sys.exit(main(sys.argv[1:]))
"""
"""``spillgate`` with every process it starts named on stderr (Python's audit event for ``subprocess.Popen``)."""


def test_a_busy_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for workers in ("1", "2"):  # the demo's simulators; with two workers, a private Redis and the workers too
            done = subprocess.run(
                [sys.executable, "-c", SPAWN_WATCH, "serve", "--port", str(port), "--workers", workers],
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
            )
            assert done.returncode == 2, done.stderr
            assert f"port {port}" in done.stderr and "--port" in done.stderr and "Traceback" not in done.stderr
            assert "SPAWNED" not in done.stderr, "nothing may start before the port is known to be free"
    assert not (tmp_path / "state").exists(), "nor any file be written"


def test_the_banner_names_the_data_directory(tmp_path: Path) -> None:
    config = yaml.safe_load((REPO_ROOT / "config" / "demo.yaml").read_text())
    config["pools"][0]["simulated"]["count"] = 1
    config["state"] = {"data_dir": "ledger-here"}
    path = tmp_path / "conf" / "demo.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    gateway = start_spillgate(
        ["serve", "--config", str(path), "--port", str(port)],
        port=port,
        log_dir=tmp_path,
        ready_path="/ready",
        timeout=90,
    )
    try:
        assert f"data directory:  {tmp_path / 'conf' / 'ledger-here'}" in gateway.log()
    finally:
        gateway.stop()
    assert (tmp_path / "conf" / "ledger-here" / "ledger.sqlite3").exists()


def test_more_workers_without_redis_say_how_to_give_one(tmp_path: Path) -> None:
    config = yaml.safe_load((REPO_ROOT / "config" / "demo.yaml").read_text())
    config["state"] = {"redis_url": "os.environ/SPILLGATE_TEST_UNSET_REDIS"}
    named = tmp_path / "named.yaml"
    named.write_text(yaml.safe_dump(config))
    env = {key: value for key, value in os.environ.items() if key != "SPILLGATE_TEST_UNSET_REDIS"}
    no_redis_server = {**env, "PATH": str(tmp_path)}  # nothing on it: no redis-server to start
    for path, environment, words in (
        (named, env, ("SPILLGATE_TEST_UNSET_REDIS", "state.redis_url")),  # a Redis named but not given
        (REPO_ROOT / "config" / "demo.yaml", no_redis_server, ("state.redis_url", "install redis-server")),
    ):
        command = ["serve", "--config", str(path), "--port", str(free_port()), "--workers", "2"]
        done = subprocess.run(
            [sys.executable, "-c", SPAWN_WATCH, *command],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env=environment,
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert all(word in done.stderr for word in words), done.stderr
        assert "SPAWNED" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
