"""The provider and replica keys an admin sent through the API, kept apart from the history so that a version
that brought one still runs after a restart.

Versions are stored and shared redacted; a key the config file holds comes back from the file at start, and an
``os.environ/NAME`` reference is stored as written. Only a literal key sent in an edit exists nowhere else: it is
kept here, in a file only the gateway's user may read, by entry (``hosted_models``/``pools`` and name) with the
destination it was sent for, and restored only onto that destination (as a redacted key is while running).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from spillgate.gateway.control.config_history import Destination
from spillgate.gateway.control.secrets import ENV_PREFIX

Keys = dict[tuple[str, str], tuple[Destination, object]]


class SecretStore:
    """Keys by (section, entry name), with where each may be sent."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._kept: Keys = self._read()

    def _read(self) -> Keys:
        kept: Keys = {}
        if self.path.exists():
            for item in json.loads(self.path.read_text()):
                where = item["destination"]
                destination = Destination(where["kind"], tuple(where["target"]), frozenset(where["addresses"]))
                kept[(item["section"], item["name"])] = (destination, item["key"])
        return kept

    def keys(self) -> Keys:
        return dict(self._kept)

    def refreshed(self) -> Keys:
        """The keys as the file holds them now: the workers of ``serve --workers`` share the data directory, so a
        key another worker was sent is here before that worker publishes the version that uses it."""
        with self._locked():
            self._kept = self._read()
        return dict(self._kept)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One reader-writer at a time across the processes sharing the file (a lock on its directory, so no lock
        file is left beside it)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def keep(self, keys: Keys, file_keys: Keys) -> None:
        """Keep each literal key of the running config (``keys``) that the config file does not hold itself
        (``file_keys``), and forget the entries where it does; written only when something changed, whole and then
        renamed over, so a crash leaves the old file or the new one. Merged with what other processes wrote to the
        file meanwhile, under a lock, so no process's key is dropped by another's write."""
        with self._locked():
            self._kept = self._read()  # every write is whole and locked: the file is the latest truth
            self._keep(keys, file_keys)

    def _keep(self, keys: Keys, file_keys: Keys) -> None:
        kept = dict(self._kept)
        for entry, found in keys.items():
            if file_keys.get(entry) == found:
                kept.pop(entry, None)
            elif isinstance(found[1], str) and not found[1].startswith(ENV_PREFIX):
                kept[entry] = found
        if kept == self._kept:
            return
        self._kept = kept
        items = [
            {
                "section": section,
                "name": name,
                "key": key,
                "destination": {
                    "kind": destination.kind,
                    "target": list(destination.target),
                    "addresses": sorted(destination.addresses),
                },
            }
            for (section, name), (destination, key) in sorted(self._kept.items())
        ]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Staged under a name of this write's own: the workers of ``serve --workers`` share the data directory,
        # and two writing at once must not rename each other's staging file away.
        fd, staging = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
        try:
            try:
                os.write(fd, json.dumps(items, indent=1).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(staging, self.path)
        except BaseException:
            Path(staging).unlink(missing_ok=True)
            raise
