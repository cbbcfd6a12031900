"""What the running config has that the config file lacks, and what a new file content would undo of it.

The running config is the file's, plus the edits made through the admin API (or adopted from another process)
since the file was last applied: its *drift*. A new file content that keeps every drifted field at its running
value undoes nothing and may apply; one that does not would silently undo an accepted edit, so it waits for the
operator. Fields are compared leaf by leaf by path (``pools.0.replicas.1``), on redacted configs, leaving out the
start-up settings, which only the file sets.
"""

from __future__ import annotations

from typing import Any

from spillgate.gateway.control.config_checks import RESTART_ONLY
from spillgate.gateway.control.config_history import diff, flatten

_MISSING = object()


def shared(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` without its start-up settings: the part an edit can change."""
    return {key: value for key, value in raw.items() if key not in RESTART_ONLY}


def drift(file: dict[str, Any], running: dict[str, Any]) -> list[str]:
    """The running config's changes from the file's, as diff lines (``routes.0.policy: 'a' -> 'b'``)."""
    return diff(shared(file), shared(running))


def undone_by(new_file: dict[str, Any], file: dict[str, Any], running: dict[str, Any]) -> list[str]:
    """The field paths where ``running`` differs from ``file`` (the file it was made on top of) and
    ``new_file`` would not keep the running value: the accepted edits applying ``new_file`` would undo."""
    before, after, new = flatten(shared(file)), flatten(shared(running)), flatten(shared(new_file))
    changed = {path for path in before.keys() | after.keys() if before.get(path, _MISSING) != after.get(path, _MISSING)}
    return sorted(path for path in changed if new.get(path, _MISSING) != after.get(path, _MISSING))
