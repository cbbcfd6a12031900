"""Where the config may send requests and secrets, and which environment variables it may read.

Both are set at start (``secrets`` in the config file, which the admin API cannot change), so a stolen admin
key can neither point a pool or a hosted model at a host of its choosing (receiving tenants' prompts and the
provider's key) nor read an arbitrary environment variable through ``os.environ/NAME``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import SplitResult, urlsplit

from spillgate.gateway.control.secrets import ENV_PREFIX


def host_allowed(url: str, patterns: Iterable[str]) -> bool:
    """``url``'s host is one of ``patterns``: a host name, ``*.domain`` (any host under it), or an address or
    network (``10.0.0.0/8``, ``127.0.0.1``)."""
    parts = _split(url)
    host = (parts.hostname or "").lower().rstrip(".") if parts is not None else ""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for pattern in patterns:
        pattern = pattern.lower().rstrip(".")
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]):
                return True
            continue
        try:
            network = ipaddress.ip_network(pattern, strict=False)
        except ValueError:
            if host == pattern:
                return True
            continue
        if address is not None and address in network:
            return True
    return False


def env_references(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Every ``os.environ/NAME`` in a raw config, as (field path, NAME)."""
    if isinstance(value, str):
        if value.startswith(ENV_PREFIX):
            yield path, value.removeprefix(ENV_PREFIX)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from env_references(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from env_references(item, f"{path}.{index}")


def env_problems(raw: Any, allowed: Iterable[str]) -> list[tuple[str, str]]:
    """The ``os.environ/`` names in ``raw`` outside ``allowed``, as config problems."""
    allowed = set(allowed)
    return [
        (path, f"environment variable {name} is not one this gateway may read: list it in secrets.env at start")
        for path, name in env_references(raw)
        if name not in allowed
    ]


def origin(url: str) -> str:
    """``scheme://host:port`` of ``url``, with the scheme's default port made explicit: where a request goes."""
    parts = _split(url)
    if parts is None:
        return f"(not a URL: {url!r})"
    scheme = (parts.scheme or "http").lower()
    host = (parts.hostname or "").lower().rstrip(".")
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        port = 0
    return f"{scheme}://{host}:{port}"


def _split(url: str) -> SplitResult | None:
    """``url`` split, or ``None`` when it does not parse (a bracketed host that is not an address, an unclosed
    bracket): the edit checks run over a raw config before the schema's verdict, and must not raise on it."""
    try:
        return urlsplit(url)
    except ValueError:
        return None


def replica_url(entry: object) -> str | None:
    """The URL of one entry of a raw config's ``replicas``: the entry itself, or its ``url`` (``{url, name}``);
    ``None`` when it has none (the schema refuses it)."""
    if isinstance(entry, dict):
        entry = entry.get("url")
    return entry if isinstance(entry, str) else None


def upstream_urls(raw: Any) -> Iterator[tuple[str, str]]:
    """Every replica URL and hosted ``api_base`` in a raw config, as (field path, URL)."""
    if not isinstance(raw, dict):
        return
    for i, pool in enumerate(raw.get("pools") or []):
        replicas = pool.get("replicas") if isinstance(pool, dict) else None
        for j, entry in enumerate(replicas if isinstance(replicas, list) else []):
            url = replica_url(entry)
            if url is not None:
                yield f"pools.{i}.replicas.{j}" + ("" if isinstance(entry, str) else ".url"), url
    for i, hosted in enumerate(raw.get("hosted_models") or []):
        if isinstance(hosted, dict) and isinstance(hosted.get("api_base"), str):
            yield f"hosted_models.{i}.api_base", hosted["api_base"]


def startup_hosts(raw: Any) -> list[str]:
    """The hosts the config at start sends requests to: ``secrets.upstream_hosts`` when it does not say."""
    split = [_split(url) for _, url in upstream_urls(raw)]
    return sorted({(parts.hostname or "").lower().rstrip(".") for parts in split if parts is not None} - {""})


def url_problems(raw: Any, hosts: Iterable[str], *, default: bool) -> list[tuple[str, str]]:
    """The replica URLs and ``api_base``s in ``raw`` whose host is not one of ``hosts``."""
    hosts = list(hosts)
    where = "secrets.upstream_hosts" + (" (by default the hosts of the config at start)" if default else "")
    return [
        (path, f"{url} is not in {where}")
        for path, url in upstream_urls(raw)
        if _split(url) is not None and not host_allowed(url, hosts)  # one that does not parse: the schema says so
    ]


def secret_destinations(raw: Any, provider_of: Callable[[str], str | None]) -> Iterator[tuple[str, str, str]]:
    """Every provider or replica key in a raw config with each place it is sent, as (field path, key as
    written, destination): a replica's origin, a hosted model's ``api_base`` origin, or its provider's own API
    (``provider openai``) when it has no ``api_base``; simulated ones stay on this machine."""
    if not isinstance(raw, dict):
        return
    for section in ("pools", "hosted_models"):
        for i, entry in enumerate(raw.get(section) or []):
            if not isinstance(entry, dict) or not isinstance(entry.get("api_key"), str):
                continue
            path = f"{section}.{i}.api_key"
            if entry.get("simulated") is not None:
                yield path, entry["api_key"], f"simulated {entry.get('name')}"
            if section == "pools":
                replicas = entry.get("replicas")
                for replica in replicas if isinstance(replicas, list) else []:
                    yield path, entry["api_key"], origin(replica_url(replica) or str(replica))
                discovered = discovery_destination(entry.get("discovery"))
                if discovered is not None:
                    yield path, entry["api_key"], discovered
            elif isinstance(entry.get("api_base"), str):
                yield path, entry["api_key"], origin(entry["api_base"])
            elif entry.get("simulated") is None:
                model = str(entry.get("model"))
                yield path, entry["api_key"], f"provider {provider_of(model) or model}"


def discovery_destination(discovery: object) -> str | None:
    """Where a pool's key goes to replicas it discovers: the pods of one namespace and label selector, as written
    (a discovered pod's address is whatever the cluster gave it, so the selector is what bounds the key), over
    one scheme to one port (from https to http the key would cross the network in cleartext; another port may be
    another container of the pod)."""
    if not isinstance(discovery, dict) or not isinstance(discovery.get("kubernetes"), dict):
        return None
    kubernetes = discovery["kubernetes"]
    namespace = kubernetes.get("namespace") or "(the gateway's own namespace)"
    scheme = kubernetes.get("scheme") or "http"
    where = f"kubernetes pods in namespace {namespace} matching {kubernetes.get('label_selector')!r}"
    return f"{where}, {scheme} to port {kubernetes.get('port')!r}"


class SecretBindings:
    """Where each secret of the config at start may be sent: the destinations it was configured with, and the
    hosts ``secrets.upstream_hosts`` lists. An edit cannot point one elsewhere, so a stolen admin key cannot have
    a provider's or a replica's key (literal, or ``os.environ/NAME``, which the admin API shows as written) sent
    to a listener of its choosing. A variable the start names for another use (a tenant key) is sent nowhere, not
    even to a listed host."""

    def __init__(
        self, startup_raw: Any, upstream_hosts: list[str] | None, provider_of: Callable[[str], str | None]
    ) -> None:
        self._provider_of = provider_of
        self._hosts = upstream_hosts or []
        self._bound: dict[str, set[str]] = {f"{ENV_PREFIX}{name}": set() for _, name in env_references(startup_raw)}
        for _, key, where in secret_destinations(startup_raw, provider_of):
            self._bound.setdefault(key, set()).add(where)

    def problems(self, raw: Any) -> list[tuple[str, str]]:
        """Each key in ``raw`` (secrets restored) that would be sent somewhere it was not bound to at start."""
        problems: list[tuple[str, str]] = []
        for path, key, where in secret_destinations(raw, self._provider_of):
            allowed = self._bound.get(key)
            if allowed is None or where in allowed or (allowed and self._widened(where)):
                continue
            message = f"this key may not be sent to {where}: it was configured at start for "
            message += ", ".join(sorted(allowed)) if allowed else "no upstream"
            message += " (send another key, or list the host in secrets.upstream_hosts at start)"
            if (path, message) not in problems:
                problems.append((path, message))
        return problems

    def bound(self, key: object) -> bool:
        """Whether ``key`` (as written) was configured at start: its destinations are bound by :meth:`problems`.
        A key sent later through the admin API is not, and only the redaction rule keeps it where it was sent."""
        return isinstance(key, str) and key in self._bound

    def _widened(self, where: str) -> bool:
        return where.startswith(("http://", "https://")) and host_allowed(where, self._hosts)
