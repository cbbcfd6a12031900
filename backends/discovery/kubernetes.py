"""One pool's replicas from the Kubernetes API: the pods of a namespace and label selector, listed and watched.

Through lightkube's async client (in-cluster config from the service account, else ``KUBECONFIG``). What its
watch does by itself, read in its source (1.0): it keeps the last ``resourceVersion`` an event carried and, when
a stream ends cleanly, watches again from it; with the default error handler it raises everything else. On a
410 Gone it would, with a retrying handler, watch again *without* a version: the API server then sends the pods
that exist as ``ADDED``, but never the ones deleted meanwhile, and an HTTP-level 410 (not an ``ERROR`` event)
it does not recognise at all. So this module keeps its own loop, the way client-go's reflector does:

- list, replacing the whole set (a pod missing from the list is gone), and watch from the list's version;
- a 410 (an ``ERROR`` event with a Status of code 410, or the answer's own status) lists again at once;
- a dropped or refused connection keeps the last known set (the replicas are likely still serving: losing the
  API server must not empty a pool), logs a WARNING, waits with jittered exponential backoff and watches again
  from the last version it saw (which may in turn be answered 410, and so relisted);
- a watch silent for ``idle_restart_s`` is started again from its version, so a half-open connection (no FIN
  from a vanished server) cannot freeze the set for good.

Each change of the set of serving pods is reported whole through ``publish``; :mod:`backends.discovery.pods`
decides which pods serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.core.exceptions import ConfigError as KubeConfigError
from lightkube.resources.core_v1 import Pod

from spillgate.backends.discovery import DiscoveredReplica
from spillgate.backends.discovery.pods import PodPort, PodSet, parse_selector

log = logging.getLogger("spillgate.discovery")

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True, slots=True)
class KubernetesSource:
    """Which pods are a pool's replicas, and where on them it serves."""

    namespace: str | None
    """``None``: the gateway's own namespace (its service account's), else ``default``."""
    label_selector: str
    port: int | str
    scheme: str = "http"

    def resolved_namespace(self) -> str:
        if self.namespace:
            return self.namespace
        try:
            return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
        except OSError:
            return "default"

    def describe(self) -> str:
        return f"pods in namespace {self.resolved_namespace()} matching {self.label_selector}"


class Gone(Exception):
    """The API server no longer has the version asked for: list again."""


class NotApplied(Exception):
    """``publish`` failed: the set is offered again after a backoff, from the last version it was applied at."""


Publish = Callable[[tuple[DiscoveredReplica, ...]], None]
ClientFactory = Callable[[], AsyncClient]


def default_client() -> AsyncClient:
    """In-cluster config from the service account, else ``KUBECONFIG`` (or ``~/.kube/config``)."""
    return AsyncClient(config=KubeConfig.from_env(), timeout=httpx2.Timeout(10.0))


class PodWatcher:
    """Follows the pods of one :class:`KubernetesSource` until :meth:`stop`; ``publish`` hears each change."""

    def __init__(
        self,
        pool: str,
        source: KubernetesSource,
        publish: Publish,
        *,
        client_factory: ClientFactory = default_client,
        backoff_s: tuple[float, float] = (0.5, 30.0),
        idle_restart_s: float = 300.0,
        serve_loopback: bool = False,
    ) -> None:
        """``serve_loopback``: pods whose IP is loopback serve (a stand-in API server on this machine)."""
        self.pool = pool
        self.source = source
        self._publish = publish
        self._client_factory = client_factory
        self._backoff = backoff_s
        self._idle_restart_s = idle_restart_s
        self._selector = parse_selector(source.label_selector)
        self._pods = PodSet(PodPort(source.port, source.scheme), loopback=serve_loopback)
        self._version: str | None = None
        """The version the set was last applied at: stored only once ``publish`` took what it brought."""
        self._published: tuple[DiscoveredReplica, ...] | None = None
        """The set ``publish`` last took; a set that differs from it is offered, whatever the pods did since."""
        self._task: asyncio.Task[None] | None = None
        self._client: AsyncClient | None = None
        self.listed = asyncio.Event()
        """Set once a first list has succeeded: the set is known."""
        self.relists = 0
        self.reconnects = 0
        self.last_error = ""
        self.connected = False
        self.since: float | None = None
        """When the current outage began (``time.time()``), or ``None`` while the API server answers."""

    def replicas(self) -> tuple[DiscoveredReplica, ...]:
        return self._pods.replicas()

    def status(self) -> dict[str, Any]:
        """For the admin API: where it looks, what it found, and how the API server answers."""
        return {
            "source": "kubernetes",
            "namespace": self.source.resolved_namespace(),
            "label_selector": self.source.label_selector,
            "port": self.source.port,
            "connected": self.connected,
            "resource_version": self._version,
            "relists": self.relists,
            "reconnects": self.reconnects,
            "last_error": self.last_error or None,
            "pods_not_serving": dict(sorted(self._pods.why.items())),
        }

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"spillgate-discovery-{self.pool}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._close_client()

    async def _run(self) -> None:
        failures = 0  # connections lost in a row
        gone = 0  # 410s in a row with no event between: a second one backs off rather than spin
        while True:
            try:
                if self._client is None:
                    self._client = self._new_client()
                if self._version is None:
                    await self._relist()
                if await self._watch():
                    gone = 0
                failures = 0  # a watch that ended by itself: start again from its version
            except NotApplied as exc:
                failures += 1
                why, cap = repr(exc.__cause__), self._delay_cap(failures)
                log.warning("discovery for pool %s: not applied (%s); again in up to %.1f s", self.pool, why, cap)
                await asyncio.sleep(self._delay(failures))
            except Gone:
                log.info("discovery for pool %s: resourceVersion %s expired; listing again", self.pool, self._version)
                self._version = None
                gone += 1
                if gone > 1:
                    await asyncio.sleep(self._delay(gone - 1))
            except (TimeoutError, httpx2.HTTPError, OSError, KubeConfigError, ValueError) as exc:
                failures += 1
                self._lost(exc, failures)
                await self._close_client()
                await asyncio.sleep(self._delay(failures))
            except Exception as exc:  # a malformed answer or a bug: never end discovery for good
                failures += 1
                log.exception("discovery for pool %s failed; keeping the last known replicas", self.pool)
                self._lost(exc, failures)
                await self._close_client()
                await asyncio.sleep(self._delay(failures))

    def _new_client(self) -> AsyncClient:
        try:
            return self._client_factory()
        except KubeConfigError:
            raise
        except Exception as exc:  # lightkube asserts on a config without a user, and more of the kind
            raise KubeConfigError(f"no usable Kubernetes client configuration: {exc!r}") from None

    async def _relist(self) -> None:
        assert self._client is not None
        namespace = self.source.resolved_namespace()
        listing = self._client.list(Pod, namespace=namespace, labels=self._selector)
        pods = [pod async for pod in listing]
        self.relists += 1
        self._connected()
        self._pods.relisted(pods)
        self._offer("listed")
        self._version = _version_of(listing)  # only now: a failure above lists again rather than watch past it
        self.listed.set()

    async def _watch(self) -> bool:
        """Follow events until the stream ends or falls silent; whether any event came."""
        assert self._client is not None
        stream = self._client.watch(
            Pod, namespace=self.source.resolved_namespace(), labels=self._selector, resource_version=self._version
        )
        events: AsyncIterator[tuple[str, Any]] = aiter(stream)
        heard = False
        try:
            while True:
                try:
                    kind, pod = await asyncio.wait_for(anext(events), self._idle_restart_s)
                except StopAsyncIteration:
                    return heard
                except TimeoutError:
                    return heard  # silent too long: watch again from the version (client-go's watch timeout)
                except ApiError as exc:
                    if exc.status.code == 410:
                        raise Gone from None
                    raise
                except httpx2.HTTPStatusError as exc:
                    if exc.response.status_code == 410:
                        raise Gone from None
                    raise
                heard = True
                self._connected()
                self._pods.event(kind, pod)
                self._offer(f"{kind} {pod.metadata.name if pod.metadata is not None else ''}")
                version = pod.metadata.resourceVersion if pod.metadata is not None else None
                if version:
                    self._version = version  # after it was applied: a failure watches again from before it
        finally:
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]

    def _offer(self, why: str) -> None:
        """Publish the set if it differs from the one last published; :class:`NotApplied` if that fails."""
        replicas = self._pods.replicas()
        if replicas == self._published:
            return
        log.warning(
            "discovery for pool %s (%s): %d replica(s) serving after %s: %s",
            self.pool,
            self.source.describe(),
            len(replicas),
            why,
            ", ".join(r.pod for r in replicas) or "none",
        )
        try:
            self._publish(replicas)
        except Exception as exc:
            raise NotApplied from exc
        self._published = replicas

    def _connected(self) -> None:
        if self.since is not None:
            down_s = time.time() - self.since
            log.warning("discovery for pool %s: the Kubernetes API answers again after %.0f s", self.pool, down_s)
        self.connected, self.since, self.last_error = True, None, ""

    def _lost(self, exc: BaseException, failures: int) -> None:
        self.connected = False
        self.reconnects += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]
        if self.since is None:
            self.since = time.time()
        log.warning(
            "discovery for pool %s: the Kubernetes API is unreachable or failed (%s); keeping the last known %d "
            "replica(s); retrying in up to %.1f s",
            self.pool,
            self.last_error,
            len(self._pods.replicas()),
            self._delay_cap(failures),
        )

    def _delay_cap(self, failures: int) -> float:
        low, high = self._backoff
        return min(high, low * 2 ** max(0, failures - 1))

    def _delay(self, failures: int) -> float:
        cap = self._delay_cap(failures)
        return cap / 2 + random.random() * cap / 2

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()


def _version_of(listing: Any) -> str | None:
    """The list's ``resourceVersion`` (what to watch from), or ``None`` when it had none."""
    try:
        return listing.resourceVersion or None
    except Exception:  # lightkube's NotReadyError: no chunk arrived
        return None
