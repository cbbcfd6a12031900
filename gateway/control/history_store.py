"""Where a config's versions are kept: one history per config file, so that two configs sharing a data directory
never read each other's versions.

A history is a JSON-lines file in ``state.data_dir``, named after its config file
(``config-history.<file stem>.<digest of its path>.jsonl``). Its first line says whose it is: the config file's
absolute path (as given, symlinks not followed: a Kubernetes ConfigMap's mount swaps a symlink on every update)
and an id generated when the history began. A file of another config is never read or written.

Before histories had an owner there was one ``config-history.jsonl`` per data directory, which every config there
appended to. Such a file is adopted (moved to the config's own name, with the owner line added) only by a config
whose file is exactly as that history last saw it: its latest version's file digest equals the file's. Any other
config leaves it where it is and starts its own. That is the safe side: a config never takes over versions
another config made, and the one that made them last finds them, edits included, as long as its file has not
changed since (had it changed, the gateway before owners would have dropped those edits at start too).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from spillgate.gateway.control.config import ConfigError
from spillgate.gateway.control.config_history import ConfigVersion

log = logging.getLogger("spillgate.config")

LEGACY_NAME = "config-history.jsonl"


@dataclass(frozen=True)
class HistoryOwner:
    """Whose versions a history holds."""

    config: str
    """The config file's absolute path, or ``(no file)``."""
    id: str
    """Generated when the history began: tells two histories of the same path apart (a data directory wiped and
    started again)."""
    created_at: float

    def to_json(self) -> str:
        return json.dumps({"history": {"config": self.config, "id": self.id, "created_at": self.created_at}})


def owner_of(config_path: Path | None) -> str:
    return str(config_path.absolute()) if config_path is not None else "(no file)"


def history_name(config: str) -> str:
    """``config-history.<stem>.<12 hex digits of the path's digest>.jsonl``: readable, and one per path."""
    return _owned_name("config-history", config, "jsonl")


def secrets_name(config: str) -> str:
    """``config-secrets.<stem>.<digest>.json``: the keys sent through the admin API (:mod:`secret_store`)."""
    return _owned_name("config-secrets", config, "json")


def _owned_name(prefix: str, config: str, extension: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", Path(config).stem)[:40].strip("-") or "config"
    return f"{prefix}.{stem}.{hashlib.sha256(config.encode()).hexdigest()[:12]}.{extension}"


class LocalHistory:
    """One config's versions, one JSON line each, after the line naming the owner; only the gateway's user may
    read the file.

    The workers of ``serve --workers`` share the file: each records the versions it makes and those it adopts
    from another, so each version is written once, by whichever process records it first (appends take a lock on
    the file and first read what the others appended), and every process's history has every version."""

    def __init__(self, path: Path, owner: HistoryOwner, versions: list[ConfigVersion], read_to: int = 0) -> None:
        self.path = path
        self.owner = owner
        self.versions = versions
        self._read_to = read_to
        """How many bytes of the file ``versions`` holds."""

    @classmethod
    def open(cls, data_dir: Path, config_path: Path | None, file_sha: str | None) -> LocalHistory:
        """The history of the config at ``config_path`` (whose content has digest ``file_sha``) in ``data_dir``:
        its own, a legacy one it adopts, or a new one. :class:`ConfigError` when the file under its name belongs
        to another config (copied or renamed by hand): guessing could mix two configs' versions."""
        config = owner_of(config_path)
        path = data_dir / history_name(config)
        if path.exists():
            owner, versions, read_to = _read(path)
            if owner is None or owner.config != config:
                whose = owner.config if owner else "no config (its owner line is missing)"
                raise ConfigError(
                    f"{path} holds the config history of {whose}, not of {config}; move it away to start afresh"
                )
            return cls(path, owner, versions, read_to)
        owner = HistoryOwner(config, uuid.uuid4().hex, time.time())
        legacy = data_dir / LEGACY_NAME
        if legacy.exists():
            _, versions, _ = _read(legacy)
            if versions and versions[-1].file_sha == file_sha:
                _adopt(legacy, path, owner)
                log.warning(
                    "config history %s adopted as %s (the config file is as its latest version saw it)", legacy, path
                )
                return cls(path, owner, versions, path.stat().st_size)
            log.warning(
                "%s was left as it is: its latest version was made from another config file content, so it may be "
                "another config's; this config's history starts in %s",
                legacy,
                path,
            )
        return cls(path, owner, [])

    @property
    def latest(self) -> ConfigVersion | None:
        return self.versions[-1] if self.versions else None

    def get(self, version: int) -> ConfigVersion | None:
        return next((v for v in self.versions if v.version == version), None)

    def append(self, version: ConfigVersion) -> None:
        """Record ``version`` unless the file has it already (another process sharing it recorded it first)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released on close
            self._read_more(fd)
            if self.get(version.version) is not None:
                return
            text = version.to_json() + "\n"
            if self._read_to == 0:
                text = self.owner.to_json() + "\n" + text
            data = text.encode()
            os.write(fd, data)
            os.fsync(fd)
            self._read_to += len(data)
            self._add(version)
        finally:
            os.close(fd)

    def _read_more(self, fd: int) -> None:
        """Take in what other processes appended since this one last read the file."""
        size = os.fstat(fd).st_size
        if size < self._read_to:  # replaced by hand since: read afresh
            self._read_to = 0
        data = os.pread(fd, size - self._read_to, self._read_to)
        data = data[: data.rfind(b"\n") + 1]  # whole lines only
        for line in data.decode().splitlines():
            owner, version = _line(line)
            if owner is not None and self._read_to == 0 and not self.versions:
                self.owner = owner  # another process began the file: its owner line is the history's
            if version is not None and self.get(version.version) is None:
                self._add(version)
        self._read_to += len(data)

    def _add(self, version: ConfigVersion) -> None:
        self.versions.append(version)
        if len(self.versions) > 1 and self.versions[-2].version > version.version:
            self.versions.sort(key=lambda v: v.version)


def _read(path: Path) -> tuple[HistoryOwner | None, list[ConfigVersion], int]:
    """The owner, the versions (each once: a file from before appends were checked may hold one several times)
    and the size read."""
    data = path.read_bytes()
    owner = None
    versions: dict[int, ConfigVersion] = {}
    for line in data.decode().splitlines():
        found, version = _line(line)
        owner = owner or found
        if version is not None:
            versions.setdefault(version.version, version)
    return owner, sorted(versions.values(), key=lambda v: v.version), len(data)


def _line(line: str) -> tuple[HistoryOwner | None, ConfigVersion | None]:
    """One line of a history file: its owner line, a version, or neither (a blank line)."""
    if not line.strip():
        return None, None
    data = json.loads(line)
    if "history" in data:
        meta = data["history"]
        return HistoryOwner(str(meta["config"]), str(meta["id"]), float(meta.get("created_at", 0.0))), None
    return None, ConfigVersion.from_json(line)


def _adopt(legacy: Path, path: Path, owner: HistoryOwner) -> None:
    """Move ``legacy`` to ``path`` with the owner line first: written whole beside it, then renamed over, so a
    crash leaves either the legacy file or the adopted one (or both: the adopted one is read first)."""
    staging = path.with_name(path.name + ".tmp")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (owner.to_json() + "\n" + legacy.read_text()).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(staging, path)
    legacy.unlink()
