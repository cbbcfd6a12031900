"""The config file as the gateway read it: its digest, its document, and why it cannot be used when it cannot."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from spillgate.gateway.control.config_history import file_digest, redact
from spillgate.gateway.control.plain_data import non_json_problems


@dataclass(frozen=True)
class FileContent:
    sha: str
    """The digest of the file's text: what versions record, to tell at start whether the file changed."""
    raw: object
    """The YAML document, not yet validated (``None`` when it is not YAML)."""
    error: str | None = None
    """Why the text is not a YAML document."""

    def redacted(self) -> dict[str, Any] | None:
        """The document as versions hold it (secrets redacted); ``None`` when it is not a mapping of plain data."""
        if self.error is not None or not isinstance(self.raw, dict) or non_json_problems(self.raw):
            return None
        return redact(self.raw)


def read_config_file(path: Path) -> FileContent | None:
    """``path``'s content now; ``None`` while it cannot be read (being replaced, say)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return FileContent(file_digest(text), None, f"not valid YAML: {exc}")
    return FileContent(file_digest(text), raw)
