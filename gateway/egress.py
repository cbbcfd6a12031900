"""Where the config may send requests and secrets, and which environment variables it may read.

Both are set at start (``secrets`` in the config file, which the admin API cannot change), so a stolen admin
key can neither point a pool or a hosted model at a host of its choosing (receiving tenants' prompts and the
provider's key) nor read an arbitrary environment variable through ``os.environ/NAME``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

from gateway.secrets import ENV_PREFIX


def host_allowed(url: str, patterns: Iterable[str]) -> bool:
    """``url``'s host is one of ``patterns``: a host name, ``*.domain`` (any host under it), or an address or
    network (``10.0.0.0/8``, ``127.0.0.1``)."""
    host = (urlsplit(url).hostname or "").lower().rstrip(".")
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
