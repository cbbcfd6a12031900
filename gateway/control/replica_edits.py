"""Adding or removing one static replica of a pool, as an edit of the running config.

The edit is made on the config as it runs and then goes through the one edit path (:meth:`LiveConfig.edit`):
validated whole, recorded as a version, shared through Redis, held against the file like any other. What only
this edit can get wrong (no such pool, a replica already there, one that is not a static replica) is refused
here, before, with the HTTP status the admin API answers.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from spillgate.gateway.control.egress import origin, replica_url
from spillgate.gateway.control.replica_names import configured_name, discovered_name

RawEdit = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass
class ReplicaEditRefused(Exception):
    """An add or remove this pool cannot take, answered with ``status`` in the admin API's error format."""

    status: int
    message: str
    code: str
    param: str | None = "url"

    def __str__(self) -> str:
        return self.message


def add_replica(
    pool: str,
    url: str,
    discovered: Mapping[str, Collection[str]],
    simulated: Collection[str],
    name: str | None = None,
) -> RawEdit:
    """The edit adding ``url`` to ``pool``'s ``replicas`` (as ``{url, name}`` when ``name`` is given; the config's
    checks refuse a name that is not one). ``discovered``: the URLs each pool's discovery found now;
    ``simulated``: the simulated replicas' URLs (neither is in the config, but either may hold the address)."""

    def edit(raw: dict[str, Any]) -> dict[str, Any]:
        entry = _pool(raw, pool)
        where = origin(url)
        if any(_origin(u) == where for u in entry.get("replicas") or []):
            raise ReplicaEditRefused(409, f"{url} is already a replica of pool {pool!r}.", "replica_exists")
        if any(origin(u) == where for u in discovered.get(pool, ())):
            raise ReplicaEditRefused(
                409, f"{url} is already a replica of pool {pool!r}: its discovery found it.", "replica_exists"
            )
        if any(origin(u) == where for u in simulated):
            raise ReplicaEditRefused(409, f"{url} is a simulated replica this gateway started.", "replica_exists")
        entry["replicas"] = [*(entry.get("replicas") or []), url if name is None else {"url": url, "name": name}]
        return raw

    return edit


def remove_replica(
    pool: str, discovered: Mapping[str, Mapping[str, str]], *, url: str | None = None, name: str | None = None
) -> RawEdit:
    """The edit removing one of ``pool``'s ``replicas``, given by ``url`` or by ``name`` (what the admin API and
    the metrics show, ``pool/name`` or ``pool/host:port``, with or without the ``pool/``); ``discovered``: each
    pool's discovered replicas, URL to pod, which leave with their pods, not through the config."""
    wanted = None if name is None else (name if name.startswith(f"{pool}/") else f"{pool}/{name}")

    def chosen(entry: object) -> bool:
        if wanted is not None:
            return configured_name(pool, _url(entry), _name(entry)) == wanted
        return url is not None and _origin(entry) == origin(url)

    def edit(raw: dict[str, Any]) -> dict[str, Any]:
        entry = _pool(raw, pool)
        replicas = list(entry.get("replicas") or [])
        kept = [u for u in replicas if not chosen(u)]
        if len(kept) == len(replicas):
            pods = discovered.get(pool, {})
            pod = next((p for u, p in pods.items() if chosen(u) or discovered_name(pool, p) == wanted), None)
            given = url if wanted is None else wanted
            if pod is not None:
                raise ReplicaEditRefused(
                    409,
                    f"{given} was discovered (pod {pod!r}), not configured: it leaves pool {pool!r} when its pod "
                    "stops matching the pool's discovery (deleted, not Ready, or relabelled), not through this API.",
                    "replica_discovered",
                    "url" if wanted is None else "name",
                )
            listed = [configured_name(pool, _url(u), _name(u)) for u in replicas] if wanted else map(_url, replicas)
            raise ReplicaEditRefused(
                404,
                f"{given} is not a static replica of pool {pool!r}; its replicas: {list(listed)}.",
                "replica_not_found",
                "url" if wanted is None else "name",
            )
        entry["replicas"] = kept
        return raw

    return edit


def _name(entry: object) -> str | None:
    """A raw ``replicas`` entry's own name, when the config gives it one."""
    name = entry.get("name") if isinstance(entry, dict) else None
    return name if isinstance(name, str) else None


def _url(entry: object) -> str:
    """A raw ``replicas`` entry's URL (``url`` or ``{url, name}``)."""
    return replica_url(entry) or str(entry)


def _origin(entry: object) -> str:
    return origin(_url(entry))


def _pool(raw: dict[str, Any], pool: str) -> dict[str, Any]:
    for entry in raw.get("pools") or []:
        if isinstance(entry, dict) and entry.get("name") == pool:
            return entry
    known = [e.get("name") for e in raw.get("pools") or [] if isinstance(e, dict)]
    raise ReplicaEditRefused(404, f"There is no pool {pool!r}; pools: {known}.", "pool_not_found", "pool")
