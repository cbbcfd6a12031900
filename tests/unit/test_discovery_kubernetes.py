"""The pod watcher through lightkube against a stand-in API server speaking the real list/watch protocol over
HTTP: pods appearing, turning unready and vanishing; a 410 Gone (as an ERROR event, and as the answer's status)
relisted; a dropped watch resumed from its version; an API server outage keeping the last known replicas."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx2
import pytest
from lightkube import AsyncClient, KubeConfig

from spillgate.backends.discovery import DiscoveredReplica
from spillgate.backends.discovery.kubernetes import KubernetesSource, PodWatcher
from spillgate.gateway.control.config import parse_config
from spillgate.gateway.control.discovery import Discovery
from spillgate.gateway.control.secrets import MissingSecret
from tests.support.kube_apiserver import KubeApiServer

LABELS = {"app": "sglang-llama"}
SOURCE = KubernetesSource(namespace="llm", label_selector="app=sglang-llama", port="http")


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    server = KubeApiServer()
    yield server
    server.stop()


class Published:
    def __init__(self) -> None:
        self.sets: list[tuple[DiscoveredReplica, ...]] = []

    def __call__(self, replicas: tuple[DiscoveredReplica, ...]) -> None:
        self.sets.append(replicas)

    @property
    def pods(self) -> list[str]:
        return [r.pod for r in self.sets[-1]] if self.sets else []

    async def until(self, check: Callable[[list[str]], bool], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not check(self.pods):
                await asyncio.sleep(0.02)


@pytest.fixture
async def watched(api: KubeApiServer, tmp_path: Path) -> AsyncIterator[tuple[PodWatcher, Published]]:
    published = Published()
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")

    def client() -> AsyncClient:
        return AsyncClient(config=KubeConfig.from_file(kubeconfig), timeout=httpx2.Timeout(5.0))

    watcher = PodWatcher("llama", SOURCE, published, client_factory=client, backoff_s=(0.05, 0.2))
    watcher.start()
    yield watcher, published
    await watcher.stop()


def add(api: KubeApiServer, name: str, last_octet: int, **extra: object) -> None:
    api.add_pod(name, f"10.0.0.{last_octet}", port=30000, labels=LABELS, namespace="llm", **extra)  # type: ignore[arg-type]


async def test_a_pod_at_the_metadata_address_is_not_served(
    api: KubeApiServer, watched: tuple[PodWatcher, Published]
) -> None:
    watcher, published = watched
    api.add_pod("metadata", "169.254.169.254", port=80, labels=LABELS, namespace="llm")
    api.add_pod("local", "127.0.0.1", port=30000, labels=LABELS, namespace="llm")
    add(api, "a", 1)
    await published.until(lambda pods: pods == ["a"])
    assert watcher.status()["pods_not_serving"] == {
        "local": "unusable IP '127.0.0.1': loopback",
        "metadata": "unusable IP '169.254.169.254': link-local",
    }


async def test_pods_appearing_turning_unready_and_vanishing(
    api: KubeApiServer, watched: tuple[PodWatcher, Published]
) -> None:
    watcher, published = watched
    add(api, "a", 1)
    api.add_pod("other", "10.0.0.9", port=30000, labels={"app": "else"}, namespace="llm")
    api.add_pod("elsewhere", "10.0.0.8", port=30000, labels=LABELS, namespace="other")
    await published.until(lambda pods: pods == ["a"])
    assert published.sets[-1] == (DiscoveredReplica("a", "http://10.0.0.1:30000"),)
    add(api, "b", 2, ready=False)
    await asyncio.to_thread(api.wait_for_watches)
    api.set_ready("b", True, namespace="llm")
    await published.until(lambda pods: pods == ["a", "b"])
    api.set_ready("a", False, namespace="llm")
    await published.until(lambda pods: pods == ["b"])
    assert watcher.status()["pods_not_serving"] == {"a": "not ready"}
    api.delete_pod("b", namespace="llm")
    await published.until(lambda pods: pods == [])
    api.set_labels("a", {"app": "else"}, namespace="llm")
    api.set_ready("a", True, namespace="llm")
    add(api, "c", 3)
    await published.until(lambda pods: pods == ["c"])
    assert "a" not in watcher.status()["pods_not_serving"], "a pod whose labels stopped matching left the set"
    assert watcher.relists == 1, "every change came through the one watch"
    watches = [path for path in api.requests if "watch=true" in path]
    assert watches and all("labelSelector=app%3Dsglang-llama" in path for path in watches)
    assert all("resourceVersion=" in path for path in watches), "the watch starts from the list's version"


@pytest.mark.parametrize("as_http", [False, True], ids=["error-event", "http-status"])
async def test_a_410_gone_relists_and_drops_pods_deleted_meanwhile(
    api: KubeApiServer, watched: tuple[PodWatcher, Published], as_http: bool
) -> None:
    watcher, published = watched
    api.gone_as_http = as_http
    add(api, "a", 1)
    add(api, "b", 2)
    await published.until(lambda pods: pods == ["a", "b"])
    await asyncio.to_thread(api.wait_for_watches)
    api.stop()  # the watch is cut while the API server is away...
    api.delete_pod("a", namespace="llm")  # ...a pod goes, and its event is compacted away
    add(api, "c", 3)
    api.compact()
    api.start()
    await published.until(lambda pods: pods == ["b", "c"])
    assert watcher.relists >= 2, "the 410 was answered with a new list"
    assert any(r.pod == "b" for r in published.sets[-1])
    assert all(pods != [] for pods in ([r.pod for r in s] for s in published.sets[1:])), "b never left meanwhile"


async def test_a_dropped_watch_resumes_from_its_version_without_a_relist(
    api: KubeApiServer, watched: tuple[PodWatcher, Published]
) -> None:
    watcher, published = watched
    add(api, "a", 1)
    await published.until(lambda pods: pods == ["a"])
    await asyncio.to_thread(api.wait_for_watches)
    api.drop_watches()
    add(api, "b", 2)
    await published.until(lambda pods: pods == ["a", "b"])
    assert watcher.relists == 1, "resumed from the version it had seen: no list"
    assert watcher.reconnects >= 1


async def test_an_api_server_outage_keeps_the_last_known_replicas(
    api: KubeApiServer, watched: tuple[PodWatcher, Published], caplog: pytest.LogCaptureFixture
) -> None:
    watcher, published = watched
    add(api, "a", 1)
    await published.until(lambda pods: pods == ["a"])
    await asyncio.to_thread(api.wait_for_watches)
    with caplog.at_level(logging.WARNING, logger="spillgate.discovery"):
        api.stop()
        async with asyncio.timeout(10):
            while watcher.reconnects < 3:
                await asyncio.sleep(0.02)
    assert watcher.replicas() == (DiscoveredReplica("a", "http://10.0.0.1:30000"),)
    assert published.pods == ["a"], "nothing was withdrawn while the API server was away"
    assert not watcher.status()["connected"]
    assert any("unreachable" in r.message and r.levelno == logging.WARNING for r in caplog.records)
    api.start()
    add(api, "b", 2)
    await published.until(lambda pods: pods == ["a", "b"])
    assert watcher.status()["connected"]


async def test_a_set_that_could_not_be_applied_is_offered_again(api: KubeApiServer, tmp_path: Path) -> None:
    """The gateway's rebuild fails (a secret gone from its environment) for the first set and the one after a
    watch event: each is offered again and applied once the rebuild works, never taken for applied before."""
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    discovery_raw = {"kubernetes": {"namespace": "llm", "label_selector": "app=sglang-llama", "port": "http"}}
    config = parse_config(
        {
            "pools": [{"name": "llama", "served_model": "m", "discovery": discovery_raw}],
            "routes": [{"name": "chat", "targets": ["llama"]}],
            "auth": {"required": False},
        }
    )
    failing = [True]
    tried: list[list[str]] = []
    applied: list[list[str]] = []

    def rebuild() -> None:
        pods = [r.pod for r in discovery.replicas(config).get("llama", ())]
        tried.append(pods)
        if failing[0]:
            raise MissingSecret("environment variable SGLANG_API_KEY is not set")
        applied.append(pods)

    def client() -> AsyncClient:
        return AsyncClient(config=KubeConfig.from_file(kubeconfig), timeout=httpx2.Timeout(5.0))

    discovery = Discovery(rebuild, client_factory=client)
    discovery.configure(config)
    add(api, "a", 1)
    await discovery.start(wait_s=0.0)
    try:
        async with asyncio.timeout(10):
            while len(tried) < 2:
                await asyncio.sleep(0.02)
        assert tried[:2] == [["a"], ["a"]], "the same set, offered again"
        assert discovery.replicas(config) == {}, "while not applied, the pool has what it had before: nothing"
        failing[0] = False
        async with asyncio.timeout(10):
            while applied != [["a"]]:
                await asyncio.sleep(0.02)
        assert [r.pod for r in discovery.replicas(config)["llama"]] == ["a"]
        failing[0] = True
        add(api, "b", 2)
        async with asyncio.timeout(10):
            while tried.count(["a", "b"]) < 2:
                await asyncio.sleep(0.02)
        assert [r.pod for r in discovery.replicas(config)["llama"]] == ["a"]
        failing[0] = False
        async with asyncio.timeout(10):
            while applied[-1] != ["a", "b"]:
                await asyncio.sleep(0.02)
        assert [r.pod for r in discovery.replicas(config)["llama"]] == ["a", "b"]
    finally:
        await discovery.stop()
