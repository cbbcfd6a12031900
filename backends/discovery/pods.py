"""Which pods are replicas: the pure decision, and the set a list and its watch events build.

A pod serves when it is Running, its ``Ready`` condition is ``True``, it has an IP and it is not being deleted
(a pod with a ``deletionTimestamp`` is terminating: its endpoints are removed too). Anything else (pending,
unready, terminating, failed, no such port) takes it out of the set, and the gateway drains it.

The IP must be a unicast address another host could reach: not loopback, link-local (the cloud metadata
service lives there), unspecified or multicast, and not malformed. A pod IP is not the pool's to choose, and
one of those would send the pool's requests and key to the gateway's own host or its node's services.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from spillgate.backends.discovery import DiscoveredReplica

log = logging.getLogger("spillgate.discovery")

_UNUSABLE_IP = "unusable IP"
"""How :func:`replica_of` begins the reason for a pod whose IP is refused (logged once per pod)."""


@dataclass(frozen=True, slots=True)
class PodPort:
    """Where on a pod the replica listens: a port number, or the name of one of its containers' ports."""

    port: int | str
    scheme: str = "http"


def replica_of(pod: Any, where: PodPort, *, loopback: bool = False) -> tuple[DiscoveredReplica | None, str]:
    """The replica ``pod`` is, or ``None`` and why not (for the log). ``pod`` is a Kubernetes Pod as lightkube
    decodes it (attribute access: ``metadata``, ``spec``, ``status``). ``loopback``: a loopback pod IP serves
    (a stand-in API server whose pods run on this machine)."""
    metadata = pod.metadata
    name = metadata.name if metadata is not None else None
    if not name:
        return None, "no name"
    if metadata.deletionTimestamp is not None:
        return None, "terminating"
    status = pod.status
    phase = status.phase if status is not None else None
    if phase != "Running":
        return None, f"phase {phase or 'unknown'}"
    if not _ready(status.conditions or ()):
        return None, "not ready"
    if not status.podIP:
        return None, "no IP yet"
    address, problem = _address(str(status.podIP), loopback)
    if address is None:
        return None, f"{_UNUSABLE_IP} {status.podIP!r}: {problem}"
    port = _port_number(pod, where.port)
    if port is None:
        return None, f"no container port named {where.port!r}"
    host = f"[{address}]" if address.version == 6 else str(address)
    return DiscoveredReplica(pod=name, url=f"{where.scheme}://{host}:{port}"), "ready"


def _address(ip: str, loopback: bool) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address | None, str]:
    """``ip`` as an address a replica may have, or ``None`` and why not."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return None, "not an IP address"
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id is not None:
            return None, "a scoped address"
        if address.ipv4_mapped is not None:  # ::ffff:127.0.0.1 reaches 127.0.0.1: judged as that
            checked: ipaddress.IPv4Address | ipaddress.IPv6Address = address.ipv4_mapped
        else:
            checked = address
    else:
        checked = address
    for refused, what in (
        (checked.is_unspecified, "unspecified"),
        (checked.is_loopback and not loopback, "loopback"),
        (checked.is_link_local, "link-local"),
        (checked.is_multicast, "multicast"),
    ):
        if refused:
            return None, what
    return address, ""


def _ready(conditions: Iterable[Any]) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def _port_number(pod: Any, port: int | str) -> int | None:
    if isinstance(port, int):
        return port
    spec = pod.spec
    for container in (spec.containers if spec is not None else None) or ():
        for declared in container.ports or ():
            if declared.name == port:
                return int(declared.containerPort)
    return None


@dataclass
class PodSet:
    """The pods of one selector as a list and the watch events after it say, and the replicas among them.

    A relist replaces everything (a pod missing from it is gone, whatever events were lost); an event changes one
    pod. ``changed`` from both says whether the set of replicas moved, so a caller reports only real changes."""

    where: PodPort
    loopback: bool = False
    """Serve pods whose IP is loopback (see :func:`replica_of`)."""
    pods: dict[str, DiscoveredReplica | None] = field(default_factory=dict)
    """Every pod seen by name: its replica, or ``None`` while it does not serve."""
    why: dict[str, str] = field(default_factory=dict)
    """Why each pod that does not serve does not."""

    def replicas(self) -> tuple[DiscoveredReplica, ...]:
        return tuple(sorted(r for r in self.pods.values() if r is not None))

    def relisted(self, pods: Iterable[Any]) -> bool:
        """Replace the set with ``pods``: built whole apart, then swapped in, so a pod that cannot be read
        leaves the set as it was rather than half replaced."""
        before = self.replicas()
        fresh = PodSet(self.where, self.loopback)
        for pod in pods:
            fresh._put(pod, warned=self.why)
        self.pods, self.why = fresh.pods, fresh.why
        return self.replicas() != before

    def event(self, kind: str, pod: Any) -> bool:
        """Apply one watch event (``ADDED``, ``MODIFIED``, ``DELETED``; ``BOOKMARK`` carries no pod)."""
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return False
        before = self.replicas()
        if kind == "DELETED":
            name = pod.metadata.name if pod.metadata is not None else None
            self.pods.pop(name or "", None)
            self.why.pop(name or "", None)
        else:
            self._put(pod)
        return self.replicas() != before

    def _put(self, pod: Any, warned: dict[str, str] | None = None) -> None:
        """``warned``: why each pod did not serve before (default: :attr:`why`), to log a refused IP once."""
        replica, why = replica_of(pod, self.where, loopback=self.loopback)
        name = pod.metadata.name if pod.metadata is not None else None
        if not name:
            return
        if why.startswith(_UNUSABLE_IP) and (self.why if warned is None else warned).get(name) != why:
            namespace = pod.metadata.namespace or "?"
            log.warning("discovery: pod %s/%s is not served: %s", namespace, name, why)
        self.pods[name] = replica
        if replica is None:
            self.why[name] = why
        else:
            self.why.pop(name, None)


class SelectorError(ValueError):
    """A label selector this gateway cannot read."""


def parse_selector(text: str) -> list[tuple[str, Any]]:
    """A label selector (``app=x,tier!=canary,env in (a,b),gpu,!legacy``) as lightkube's (key, operator) pairs,
    which it encodes back for the API server's ``labelSelector``; :class:`SelectorError` if malformed."""
    from lightkube import operators

    pairs: list[tuple[str, Any]] = []
    for term in _terms(text):
        words = term.split()
        if len(words) >= 2 and words[1] in ("in", "notin"):
            key, op = words[0], words[1]
            rest = term.split(None, 2)[2].strip() if len(words) > 2 else ""
            if not (rest.startswith("(") and rest.endswith(")")):
                raise SelectorError(f"{term!r}: expected '{key} {op} (a,b)'")
            values = [v.strip() for v in rest[1:-1].split(",") if v.strip()]
            if not values:
                raise SelectorError(f"{term!r}: no values")
            pairs.append((_key(key), operators.in_(values) if op == "in" else operators.not_in(values)))
        elif "!=" in term:
            key, value = term.split("!=", 1)
            pairs.append((_key(key), operators.not_equal(_value(value))))
        elif "=" in term:
            key, value = term.split("==", 1) if "==" in term else term.split("=", 1)
            pairs.append((_key(key), operators.equal(_value(value))))
        elif term.startswith("!"):
            pairs.append((_key(term[1:]), operators.not_exists()))
        else:
            pairs.append((_key(term), operators.exists()))
    if not pairs:
        raise SelectorError("empty selector")
    return pairs


def _terms(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    terms, depth, current = [], 0, ""
    for char in text:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += char
    terms.append(current.strip())
    if any(not term for term in terms):
        raise SelectorError(f"{text!r}: an empty term")
    return terms


def _key(key: str) -> str:
    key = key.strip()
    if not key or any(c.isspace() or c in "=!(),'\"" for c in key):
        raise SelectorError(f"{key!r} is not a label key")
    return key


def _value(value: str) -> str:
    value = value.strip()
    if any(c.isspace() or c in "=!()," for c in value):
        raise SelectorError(f"{value!r} is not a label value")
    return value
