"""Config versions: what each was, who made it, what it changed, shown without secrets."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from spillgate.gateway.control.egress import discovery_destination, replica_url
from spillgate.gateway.control.secrets import ENV_PREFIX
from spillgate.gateway.tenancy.tenants import key_digest

REDACTED = "<redacted>"


@dataclass(frozen=True)
class ConfigVersion:
    version: int
    applied_at: float
    author: str
    """``startup``, ``file``, or the admin key id (``admin:<id>``) that made the edit or rollback."""
    raw: dict[str, Any]
    """The config, redacted (:func:`redact`): versions are stored and shared without secrets; a rollback
    takes the secrets they hide from the running config."""
    diff: tuple[str, ...]
    file_sha: str | None = None
    """The digest of the config file this version was made from or on top of, to tell at start-up whether the
    file changed since."""
    file_raw: dict[str, Any] | None = None
    """For a version made on top of the file (an admin edit, a rollback, a version adopted from the fleet): the
    file's config (redacted) it was made on top of, so that what it changed there is known after a restart.
    ``None`` for a version made from the file itself (``startup``, ``file``)."""

    def summary(self) -> dict[str, Any]:
        return {"version": self.version, "applied_at": self.applied_at, "author": self.author, "diff": list(self.diff)}

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ConfigVersion:
        data = json.loads(text)
        return cls(
            version=int(data["version"]),
            applied_at=float(data["applied_at"]),
            author=str(data["author"]),
            raw=data["raw"],
            diff=tuple(data["diff"]),
            file_sha=data.get("file_sha"),
            file_raw=data.get("file_raw"),
        )


def file_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def new_version(
    number: int,
    author: str,
    raw: dict[str, Any],
    previous: dict[str, Any] | None,
    file_sha: str | None,
    file_raw: dict[str, Any] | None = None,
) -> ConfigVersion:
    return ConfigVersion(number, time.time(), author, raw, tuple(diff(previous or {}, raw)), file_sha, file_raw)


def redact(raw: dict[str, Any]) -> dict[str, Any]:
    """The config as an admin may see it: keys become their digests (still valid in a config), provider and
    replica keys and Redis passwords become ``<redacted>`` (restored when sent back to the same destination)."""
    out = json.loads(json.dumps(raw))
    for tenant in out.get("tenants") or []:
        if isinstance(tenant, dict) and isinstance(tenant.get("keys"), list):
            tenant["keys"] = [_key_spec(k) for k in tenant["keys"]]
    admin = out.get("admin")
    if isinstance(admin, dict) and isinstance(admin.get("keys"), list):
        admin["keys"] = [_key_spec(k) for k in admin["keys"]]
    metrics = out.get("metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get("token"), str):
        metrics["token"] = _key_spec(metrics["token"])
    for section in _KEYED_SECTIONS:
        for entry in out.get(section) or []:
            if isinstance(entry, dict) and _is_literal_secret(entry.get("api_key")):
                entry["api_key"] = REDACTED
    state = out.get("state")
    if isinstance(state, dict) and _is_literal_secret(state.get("redis_url")) and "@" in state["redis_url"]:
        state["redis_url"] = REDACTED
    return out


_KEYED_SECTIONS = ("hosted_models", "pools")
"""The sections whose entries hold a key for somewhere else: a provider's, or the replicas' ``--api-key``."""


class Destination(NamedTuple):
    """Where an entry's key is sent: a hosted model's model (its provider) and base URL; a pool's engine, the
    pods it discovers and its replicas. A redacted key is restored only onto the same destination."""

    kind: str
    target: tuple[object, ...]
    addresses: frozenset[str] = frozenset()

    def admits(self, new: Destination) -> bool:
        """``new`` sends the key nowhere this did not: the same target, and (a pool) no replica added."""
        return new.kind == self.kind and new.target == self.target and new.addresses <= self.addresses


def destination(section: str, entry: dict[str, Any]) -> Destination:
    if section == "hosted_models":
        return Destination("hosted", (entry.get("model"), entry.get("api_base")))
    replicas = entry.get("replicas")
    addresses = frozenset(replica_url(r) or str(r) for r in replicas) if isinstance(replicas, list) else frozenset()
    target = (entry.get("engine", "sglang"), discovery_destination(entry.get("discovery")))
    return Destination("pool", target, addresses)


def known_keys(raw: dict[str, Any]) -> dict[tuple[str, str], tuple[Destination, object]]:
    """Every key ``raw`` holds in the clear, by (section, entry name): the key and its destination."""
    known: dict[tuple[str, str], tuple[Destination, object]] = {}
    for section in _KEYED_SECTIONS:
        for entry in raw.get(section) or []:
            if isinstance(entry, dict) and entry.get("api_key") not in (None, REDACTED):
                known[(section, str(entry.get("name")))] = (destination(section, entry), entry["api_key"])
    return known


def unredact(
    raw: dict[str, Any],
    keys: dict[tuple[str, str], tuple[Destination, object]],
    redis_url: object = None,
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Put back the secrets :func:`redact` hid, so a GET-edit-PUT round trip works; and the problems: each
    redacted key that cannot be put back because this gateway never had it or its destination changed (a
    pool's new replica, a hosted model's new provider, model or base URL must be sent the key again, or an
    admin key could send it anywhere)."""
    out = json.loads(json.dumps(raw))
    problems: list[tuple[str, str]] = []
    for section in _KEYED_SECTIONS:
        for index, entry in enumerate(out.get(section) or []):
            if not isinstance(entry, dict) or entry.get("api_key") != REDACTED:
                continue
            found = keys.get((section, str(entry.get("name"))))
            where = f"{section}.{index}.api_key"
            if found is None:
                problems.append((where, "redacted, and this gateway does not know its key: send the key again"))
            elif not found[0].admits(destination(section, entry)):
                problems.append((where, "redacted, and where it is sent changed: send the key again"))
            else:
                entry["api_key"] = found[1]
    state = out.get("state")
    if isinstance(state, dict) and state.get("redis_url") == REDACTED:
        state["redis_url"] = redis_url
    return out, problems


def _is_literal_secret(value: object) -> bool:
    return isinstance(value, str) and bool(value) and not value.startswith(ENV_PREFIX)


def _key_spec(spec: object) -> object:
    if not isinstance(spec, str) or spec.startswith(("sha256:", ENV_PREFIX)):
        return spec
    return "sha256:" + key_digest(spec)


def diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """One line per changed leaf, secrets redacted: ``routes.0.policy: 'least_load' -> 'round_robin'``."""
    before, after = flatten(redact(old)), flatten(redact(new))
    lines = []
    for path in sorted(before.keys() | after.keys()):
        if path not in after:
            lines.append(f"{path}: {before[path]!r} removed")
        elif path not in before:
            lines.append(f"{path}: added {after[path]!r}")
        elif before[path] != after[path]:
            lines.append(f"{path}: {before[path]!r} -> {after[path]!r}")
    return lines


def change_summary(lines: tuple[str, ...] | list[str], limit: int = 8) -> str:
    """A diff as its field paths and what happened to each, never a value (a log line must hold no secret):
    ``2 change(s): pools.0.replicas.1 added, routes.0.policy changed``."""
    if not lines:
        return "no change"
    parts = []
    for line in lines[:limit]:
        path, _, rest = line.partition(": ")
        parts.append(
            f"{path} {'added' if rest.startswith('added ') else 'removed' if rest.endswith(' removed') else 'changed'}"
        )
    more = f", and {len(lines) - limit} more" if len(lines) > limit else ""
    return f"{len(lines)} change(s): {', '.join(parts)}{more}"


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a config by its field path (``routes.0.policy``); an empty mapping or list is a leaf."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and value:
        out = {}
        for index, item in enumerate(value):
            out.update(flatten(item, f"{prefix}.{index}"))
        return out
    return {prefix: value}
