"""The name each replica of a pool goes by: the key of its learned state, here and in Redis.

A replica's name keys everything the gateway learns about it (prefix index, latency and prefill estimates, load
tickets, health) in this process and, through Redis, in every other one; metrics, the access log and the admin
API show it. So it must not change while the replica stays, whatever else joins or leaves the pool, and every
process must derive the same one from the same config version, however it got there (applying each edit, or
starting on the latest). Names are therefore derived from what identifies the replica, never from its position:

- a configured replica: ``pool/host:port``, its address (the form SGLang's router keys workers by, its URL),
  or ``pool/name`` when the config names it (``{url, name}``);
- a discovered one: ``pool/pod``;
- a simulated one, started by the gateway on a free port that differs at every start: ``pool-<index>``, its
  place among the pool's simulated replicas, which only a restart changes (their count is a start-up setting).

``host:port`` always holds a ``:`` and neither a configured name nor a pod name can, so an address never
takes the name of a named or discovered replica.
"""

from __future__ import annotations

from urllib.parse import quote

from spillgate.gateway.control.egress import origin

REPLICA_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""A configured replica's own name: no ``/`` (the pool's is before it) and no ``:`` (an address's is)."""


def configured_name(pool: str, url: str, name: str | None = None) -> str:
    """A configured replica's name: ``pool/name`` when the config names it, else ``pool/host:port`` (host in
    lower case, the scheme's default port written out, so ``http://H`` and ``http://h:80`` are one replica)."""
    return f"{pool}/{name if name is not None else address(url)}"


def address(url: str) -> str:
    """``host:port`` of a replica URL, in ASCII (a header carries the name): an international host in its IDNA
    form, anything else outside ASCII percent-encoded."""
    host_port = origin(url).partition("://")[2]
    if host_port.isascii():
        return host_port
    host, _, port = host_port.rpartition(":")
    try:
        host = host.encode("idna").decode("ascii")
    except UnicodeError:
        host = quote(host, safe="[]%")
    return f"{host}:{port}"


def simulated_name(pool: str, index: int) -> str:
    """The ``index``-th simulated replica's name (from 0)."""
    return f"{pool}-{index}"


def discovered_name(pool: str, pod: str) -> str:
    """A discovered replica's name: its pool and pod, the same in every gateway process and for as long as the
    pod lives."""
    return f"{pool}/{pod}"
