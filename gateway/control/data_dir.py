"""Where a gateway keeps its cost ledger and config history when its config does not say."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from spillgate.gateway.control.config import StateConfig


def user_state_home() -> Path:
    """``$XDG_STATE_HOME/spillgate``, else ``~/.local/state/spillgate``: the user's, never the working directory,
    so a gateway started from another directory finds its ledger. A relative ``XDG_STATE_HOME`` is ignored, as
    the XDG base directory specification says."""
    given = os.environ.get("XDG_STATE_HOME", "")
    base = Path(given) if given and Path(given).is_absolute() else Path.home() / ".local" / "state"
    return base / "spillgate"


def data_directory(settings: StateConfig, config_path: Path | None) -> Path:
    """The configured ``data_dir`` (a relative one from the config file's directory), else one directory per
    config file under :func:`user_state_home`: two configs never share a ledger or a history by accident."""
    if settings.data_dir is not None:
        configured = Path(settings.data_dir).expanduser()
        if configured.is_absolute() or config_path is None:
            return configured
        return config_path.resolve().parent / configured
    if config_path is None:
        return user_state_home() / "default"
    resolved = config_path.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:10]
    return user_state_home() / f"{resolved.stem}-{digest}"
