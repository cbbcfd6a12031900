"""The one owner of the replicas found at run time: a watcher per pool that asks for one, and the set each found.

The config says where to look (a pool's ``discovery``); this keeps one watcher per pool in line with the running
config (started, moved when the pool's discovery changes, stopped when it goes) and the replicas each one last
reported. Those are runtime state: they join the catalog every config version builds (:meth:`replicas`), survive
unrelated edits, and are never written into a version. A change is handed to ``on_change`` (the gateway rebuilds
its catalog), nothing else writes the set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from spillgate.backends.discovery import DiscoveredReplica
from spillgate.gateway.control.config import GatewayConfig, PoolConfig

if TYPE_CHECKING:  # lightkube takes a second to import: only a config that discovers pays for it
    from spillgate.backends.discovery.kubernetes import ClientFactory, KubernetesSource, PodWatcher

log = logging.getLogger("spillgate.discovery")

LOOPBACK_ENV = "SPILLGATE_DISCOVERY_LOOPBACK_PODS"
"""Set to ``1`` at start, pods whose IP is loopback serve: only a stand-in API server on the gateway's machine
(the tests) has them. An environment variable, so no config edit through the admin API can turn it on."""

_FIRST_LIST_S = 5.0
"""How long the gateway waits at start for each pool's first list, so it starts serving the pods already up."""


def source_of(pool: PoolConfig) -> KubernetesSource | None:
    if pool.discovery is None:
        return None
    from spillgate.backends.discovery.kubernetes import KubernetesSource

    kubernetes = pool.discovery.kubernetes
    return KubernetesSource(kubernetes.namespace, kubernetes.label_selector, kubernetes.port, kubernetes.scheme)


class NotAppliedError(RuntimeError):
    """``on_change`` said the replicas found could not be applied."""


class Discovery:
    """Watchers by pool, and what each found."""

    def __init__(
        self,
        on_change: Callable[[], bool | None],
        *,
        client_factory: ClientFactory | None = None,
        serve_loopback: bool | None = None,
    ) -> None:
        """``on_change`` rebuilds the catalog with :meth:`replicas`; raising or returning ``False`` says it could
        not, and the set found is offered again later. ``client_factory``: the Kubernetes client each watcher uses
        (default: in-cluster, else KUBECONFIG).
        ``serve_loopback``: pods with a loopback IP serve (default: :data:`LOOPBACK_ENV` says so)."""
        self._on_change = on_change
        self._client_factory = client_factory
        if serve_loopback is None:
            serve_loopback = os.environ.get(LOOPBACK_ENV) == "1"
        self._serve_loopback = serve_loopback
        self._wanted: dict[str, KubernetesSource] = {}
        self._watchers: dict[str, PodWatcher] = {}
        self._found: dict[str, tuple[KubernetesSource, tuple[DiscoveredReplica, ...]]] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._started = False

    def configure(self, config: GatewayConfig) -> None:
        """Follow the pools ``config`` asks to discover (a config version was applied); what a pool's old source
        found is dropped with it (:meth:`replicas` already leaves it out)."""
        self._wanted = {pool.name: source for pool in config.pools if (source := source_of(pool)) is not None}
        for pool in [p for p, (source, _) in self._found.items() if self._wanted.get(p) != source]:
            del self._found[pool]
        if self._started:
            self._reconcile()

    def replicas(self, config: GatewayConfig) -> Mapping[str, Sequence[DiscoveredReplica]]:
        """What each pool of ``config`` has discovered through the source that config names."""
        found = {}
        for pool in config.pools:
            entry = self._found.get(pool.name)
            if entry is not None and entry[0] == source_of(pool):
                found[pool.name] = entry[1]
        return found

    def status(self) -> dict[str, Any]:
        """For the admin API: each pool's source, how it answers, and what it found."""
        shown: dict[str, Any] = {}
        for pool, watcher in sorted(self._watchers.items()):
            found = self._found.get(pool)
            shown[pool] = watcher.status() | {
                "replicas": [{"pod": r.pod, "url": r.url} for r in (found[1] if found else ())]
            }
        return shown

    async def start(self, wait_s: float = _FIRST_LIST_S) -> None:
        """Start the watchers and wait (up to ``wait_s``) for their first lists."""
        self._started = True
        self._reconcile()
        waits = [watcher.listed.wait() for watcher in self._watchers.values()]
        if waits:
            try:
                await asyncio.wait_for(asyncio.gather(*waits), wait_s)
            except TimeoutError:
                late = [p for p, w in self._watchers.items() if not w.listed.is_set()]
                log.warning("discovery: no first list within %.0f s for pool(s) %s; serving without them", wait_s, late)

    async def stop(self) -> None:
        self._started = False
        watchers, self._watchers = list(self._watchers.values()), {}
        for watcher in watchers:
            await watcher.stop()
        for task in list(self._stopping):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _reconcile(self) -> None:
        for pool, watcher in list(self._watchers.items()):
            if self._wanted.get(pool) != watcher.source:
                del self._watchers[pool]
                task = asyncio.get_running_loop().create_task(watcher.stop())
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)
        for pool, source in self._wanted.items():
            if pool not in self._watchers:
                from spillgate.backends.discovery.kubernetes import PodWatcher, default_client

                publish = self._publisher(pool, source)
                watcher = PodWatcher(
                    pool,
                    source,
                    publish,
                    client_factory=self._client_factory or default_client,
                    serve_loopback=self._serve_loopback,
                )
                self._watchers[pool] = watcher
                watcher.start()
                log.warning("discovery for pool %s: following %s", pool, source.describe())

    def _publisher(self, pool: str, source: KubernetesSource) -> Callable[[tuple[DiscoveredReplica, ...]], None]:
        def publish(replicas: tuple[DiscoveredReplica, ...]) -> None:
            """Apply ``replicas``; on failure the set applied before is kept and the error raised, so the watcher
            offers the same set again rather than it being taken for applied."""
            if self._wanted.get(pool) != source:
                return  # a watcher being stopped: its pool moved on
            previous = self._found.get(pool)
            if previous is not None and previous[1] == replicas:
                return
            self._found[pool] = (source, replicas)  # the catalog is built from it
            try:
                applied = self._on_change()
            except Exception:
                self._restore(pool, previous)
                raise
            if applied is False:
                self._restore(pool, previous)
                raise NotAppliedError(f"the catalog for pool {pool} could not be rebuilt with its replicas")

        return publish

    def _restore(self, pool: str, previous: tuple[KubernetesSource, tuple[DiscoveredReplica, ...]] | None) -> None:
        if previous is None:
            self._found.pop(pool, None)
        else:
            self._found[pool] = previous
