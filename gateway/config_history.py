"""Config versions: what each was, who made it, what it changed, kept durably and shown without secrets."""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gateway.secrets import ENV_PREFIX
from gateway.tenants import key_digest

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
    """The config file's digest when this version was made, to tell at start-up whether it changed since."""

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
        )


def file_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class LocalHistory:
    """Every version as one JSON line in a file only the gateway's user may read."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self.versions: list[ConfigVersion] = []
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    self.versions.append(ConfigVersion.from_json(line))

    @property
    def latest(self) -> ConfigVersion | None:
        return self.versions[-1] if self.versions else None

    def get(self, version: int) -> ConfigVersion | None:
        return next((v for v in self.versions if v.version == version), None)

    def append(self, version: ConfigVersion) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, (version.to_json() + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self.versions.append(version)


def new_version(
    number: int, author: str, raw: dict[str, Any], previous: dict[str, Any] | None, file_sha: str | None
) -> ConfigVersion:
    return ConfigVersion(number, time.time(), author, raw, tuple(diff(previous or {}, raw)), file_sha)


def redact(raw: dict[str, Any]) -> dict[str, Any]:
    """The config as an admin may see it: keys become their digests (still valid in a config), provider
    keys and Redis passwords become ``<redacted>`` (restored from the running config when sent back)."""
    out = json.loads(json.dumps(raw))
    for tenant in out.get("tenants") or []:
        if isinstance(tenant, dict) and isinstance(tenant.get("keys"), list):
            tenant["keys"] = [_key_spec(k) for k in tenant["keys"]]
    admin = out.get("admin")
    if isinstance(admin, dict) and isinstance(admin.get("keys"), list):
        admin["keys"] = [_key_spec(k) for k in admin["keys"]]
    for hosted in out.get("hosted_models") or []:
        if isinstance(hosted, dict) and _is_literal_secret(hosted.get("api_key")):
            hosted["api_key"] = REDACTED
    state = out.get("state")
    if isinstance(state, dict) and _is_literal_secret(state.get("redis_url")) and "@" in state["redis_url"]:
        state["redis_url"] = REDACTED
    return out


def unredact(raw: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """Put back the secrets :func:`redact` hid, from the running config, so a GET-edit-PUT round trip works."""
    out = json.loads(json.dumps(raw))
    current_keys = {h.get("name"): h.get("api_key") for h in current.get("hosted_models") or [] if isinstance(h, dict)}
    for hosted in out.get("hosted_models") or []:
        if isinstance(hosted, dict) and hosted.get("api_key") == REDACTED:
            hosted["api_key"] = current_keys.get(hosted.get("name"))
    state = out.get("state")
    if isinstance(state, dict) and state.get("redis_url") == REDACTED:
        state["redis_url"] = (current.get("state") or {}).get("redis_url")
    return out


def _is_literal_secret(value: object) -> bool:
    return isinstance(value, str) and bool(value) and not value.startswith(ENV_PREFIX)


def _key_spec(spec: object) -> object:
    if not isinstance(spec, str) or spec.startswith(("sha256:", ENV_PREFIX)):
        return spec
    return "sha256:" + key_digest(spec)


def diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """One line per changed leaf, secrets redacted: ``routes.0.policy: 'least_load' -> 'round_robin'``."""
    before, after = _flatten(redact(old)), _flatten(redact(new))
    lines = []
    for path in sorted(before.keys() | after.keys()):
        if path not in after:
            lines.append(f"{path}: {before[path]!r} removed")
        elif path not in before:
            lines.append(f"{path}: added {after[path]!r}")
        elif before[path] != after[path]:
            lines.append(f"{path}: {before[path]!r} -> {after[path]!r}")
    return lines


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and value:
        out = {}
        for index, item in enumerate(value):
            out.update(_flatten(item, f"{prefix}.{index}"))
        return out
    return {prefix: value}
