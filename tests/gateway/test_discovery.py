"""A gateway whose pool takes its replicas from Kubernetes pods, against a stand-in API server speaking the real
list/watch protocol (:mod:`tests.support.kube_apiserver`) and simulated replicas standing behind the pods.

Pods appearing, turning unready and vanishing move real traffic: a discovered replica serves, a removed one
gets no new request (its own request counter says so) while the stream it was serving finishes; discovered
replicas survive an unrelated config edit and are never written into the config; a dropped watch, a 410 Gone and
an API server outage keep the pool serving.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from spillgate.gateway.control.discovery import LOOPBACK_ENV
from tests.gateway.test_live_config import ADMIN, ADMIN_KEY, TENANT, current, eventually, put
from tests.support.gateway import TENANT_KEY, running_replicas
from tests.support.kube_apiserver import KubeApiServer
from tests.support.procs import RunningProcess, free_port, start_spillgate

NS = "llm"
LABELS = {"app": "sim"}


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RunningProcess]]:
    # At real speed: a 300-token stream lasts seconds, long enough to be in flight when its pod turns unready.
    yield from running_replicas(tmp_path_factory.mktemp("discovered-replicas"), 3)


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    server = KubeApiServer()
    yield server
    server.stop()


def pod_of(api: KubeApiServer, name: str, replica: RunningProcess, **extra: Any) -> None:
    """A pod named ``name`` whose container port ``http`` is ``replica``'s."""
    port = int(replica.url.rsplit(":", 1)[1])
    api.add_pod(name, "127.0.0.1", port=port, labels=LABELS, namespace=NS, **extra)


def start(api: KubeApiServer, tmp_path: Path) -> RunningProcess:
    raw = {
        "pools": [
            {
                "name": "pool",
                "served_model": "sim-model",
                "discovery": {"kubernetes": {"namespace": NS, "label_selector": "app=sim", "port": "http"}},
            }
        ],
        "routes": [{"name": "chat", "targets": ["pool"], "policy": "round_robin"}],
        "tenants": [{"name": "tenant-a", "keys": [TENANT_KEY]}],
        "admin": {"keys": [ADMIN_KEY]},
        "health": {"interval_s": 0.2, "timeout_s": 1.0, "unhealthy_after": 1},
        "state": {"data_dir": str(tmp_path / "data")},
    }
    path = tmp_path / "spillgate.yaml"
    path.write_text(yaml.safe_dump(raw))
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    port = free_port()
    return start_spillgate(
        ["serve", "--config", str(path), "--port", str(port)],
        port=port,
        log_dir=tmp_path,
        env={"KUBECONFIG": str(kubeconfig), LOOPBACK_ENV: "1"},  # the pods are simulated replicas on 127.0.0.1
    )


@pytest.fixture
def gateway(api: KubeApiServer, replicas: list[RunningProcess], tmp_path: Path) -> Iterator[RunningProcess]:
    pod_of(api, "a", replicas[0])
    proc = start(api, tmp_path)
    yield proc
    proc.stop()


def ask(gateway: RunningProcess) -> str:
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers=TENANT,
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.headers["x-spillgate-backend"]


def served_by(gateway: RunningProcess, count: int = 6) -> set[str]:
    return {ask(gateway) for _ in range(count)}


def discovered(gateway: RunningProcess) -> set[str]:
    listed = httpx.get(gateway.url + "/admin/backends", headers=ADMIN).json()["backends"]
    return {b["name"] for b in listed if b.get("origin") == "discovered"}


def requests_seen(replica: RunningProcess) -> float:
    """The replica's own count of requests it processed (SGLang's ``num_requests_total``)."""
    lines = httpx.get(replica.url + "/metrics").text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("sglang:num_requests_total"))


def test_discovered_replicas_follow_their_pods_and_serve(
    gateway: RunningProcess, api: KubeApiServer, replicas: list[RunningProcess]
) -> None:
    assert discovered(gateway) == {"pool/a"}, "the pod up at start serves from the first request"
    assert served_by(gateway) == {"pool/a"}
    pod_of(api, "b", replicas[1], ready=False)
    pod_of(api, "c", replicas[2])
    eventually(lambda: discovered(gateway) == {"pool/a", "pool/c"})
    assert served_by(gateway) == {"pool/a", "pool/c"}, "an unready pod serves nothing"
    api.set_ready("b", True, namespace=NS)
    eventually(lambda: discovered(gateway) == {"pool/a", "pool/b", "pool/c"})
    assert served_by(gateway, 9) == {"pool/a", "pool/b", "pool/c"}

    # A pod turning unready is drained: the stream it serves finishes, and it gets no new request.
    outcome: dict[str, Any] = {}
    started = threading.Event()

    def long_stream() -> None:
        body = {"model": "chat", "messages": [{"role": "user", "content": "go"}], "max_tokens": 300, "stream": True}
        with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, headers=TENANT, timeout=60) as r:
            outcome["backend"] = r.headers.get("x-spillgate-backend")
            lines = []
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                    started.set()
            outcome["last"] = lines[-1] if lines else None
        started.set()

    thread = threading.Thread(target=long_stream)
    thread.start()
    assert started.wait(30)
    drained = outcome["backend"]
    replica = replicas["abc".index(drained.removeprefix("pool/"))]
    before = requests_seen(replica)
    api.set_ready(drained.removeprefix("pool/"), False, namespace=NS)
    eventually(lambda: drained not in discovered(gateway))
    draining = httpx.get(gateway.url + "/admin/backends", headers=ADMIN).json()["draining"]
    assert [(b["name"], b["in_flight"]) for b in draining] == [(drained, 1)], "the stream was still running there"
    assert drained not in served_by(gateway, 8)
    thread.join(60)
    assert outcome["last"] == "data: [DONE]", "the stream in flight on the drained replica finished"
    # The replica counts a request when it ends: the one stream that was running there, and nothing sent since.
    assert requests_seen(replica) == before + 1, "the drained replica got no request after its pod turned unready"

    api.delete_pod("c", namespace=NS)
    eventually(lambda: "pool/c" not in discovered(gateway))
    assert "pool/c" not in served_by(gateway)
    backends = set(httpx.get(gateway.url + "/health").json()["backends"])
    assert "pool/c" not in backends and drained not in backends


def test_discovered_replicas_survive_an_edit_and_stay_out_of_the_config(
    gateway: RunningProcess, api: KubeApiServer, replicas: list[RunningProcess]
) -> None:
    pod_of(api, "b", replicas[1])
    eventually(lambda: discovered(gateway) == {"pool/a", "pool/b"})
    shown = current(gateway)
    assert shown["discovered"] == {
        "pool": [
            {"name": "pool/a", "pod": "a", "url": replicas[0].url},
            {"name": "pool/b", "pod": "b", "url": replicas[1].url},
        ]
    }
    assert "replicas" not in shown["config"]["pools"][0] or shown["config"]["pools"][0]["replicas"] == []
    config = shown["config"]
    config["routes"][0]["policy"] = "least_load"
    edited = put(gateway, config)
    assert edited.status_code == 200, edited.text
    assert all("replicas" not in line for line in edited.json()["diff"]), edited.json()["diff"]
    assert discovered(gateway) == {"pool/a", "pool/b"}, "an unrelated edit keeps the discovered replicas"
    assert served_by(gateway, 8) <= {"pool/a", "pool/b"}
    history = httpx.get(gateway.url + "/admin/config/history", headers=ADMIN).json()["versions"]
    assert not any(replicas[1].url in str(version) for version in history)


def test_a_dropped_watch_a_410_and_an_api_outage_keep_the_pool_serving(
    gateway: RunningProcess, api: KubeApiServer, replicas: list[RunningProcess]
) -> None:
    api.wait_for_watches()
    api.drop_watches()
    pod_of(api, "b", replicas[1])
    eventually(lambda: discovered(gateway) == {"pool/a", "pool/b"})

    api.stop()
    eventually(lambda: "unreachable" in gateway.log())
    assert served_by(gateway, 6) == {"pool/a", "pool/b"}, "the API server's loss removes no healthy replica"
    status = httpx.get(gateway.url + "/admin/backends", headers=ADMIN).json()["discovery"]["pool"]
    assert status["connected"] is False and status["last_error"]
    assert " WARNING spillgate.discovery: discovery for pool pool: the Kubernetes API is unreachable" in gateway.log()

    api.delete_pod("b", namespace=NS)  # while the gateway cannot see, and its event is compacted away
    pod_of(api, "c", replicas[2])
    api.compact()
    api.start()
    eventually(lambda: discovered(gateway) == {"pool/a", "pool/c"}, timeout=40)
    assert served_by(gateway) == {"pool/a", "pool/c"}
    assert httpx.get(gateway.url + "/admin/backends", headers=ADMIN).json()["discovery"]["pool"]["relists"] >= 2
