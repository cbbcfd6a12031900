"""Keep provider credentials out of every message and log line this package produces or relays.

litellm's exception text can carry request details, and providers echo parts of a bad key back; so
error messages are scrubbed of the exact secrets of the model concerned, and log records from litellm
of anything shaped like a credential (the filter cannot know the keys: it holds no state).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

REDACTED = "[redacted]"

# Credential shapes: OpenAI/Anthropic-style keys, bearer tokens, AWS access key ids, and key=value pairs.
_PATTERNS = re.compile(
    r"""
    \bsk-[A-Za-z0-9_\-]{6,}
    | \bAKIA[0-9A-Z]{16}\b
    | (?<=[Bb]earer\ )[^\s'",]+
    | (?<=x-api-key)(?P<sep1>['"]?\s*[:=]\s*['"]?)[^\s'",]+
    | (?<=api_key)(?P<sep2>['"]?\s*[:=]\s*['"]?)[^\s'",)]+
    | (?<=aws_secret_access_key)(?P<sep3>['"]?\s*[:=]\s*['"]?)[^\s'",)]+
    """,
    re.VERBOSE | re.IGNORECASE,
)
_MIN_SECRET_CHARS = 4


def _replace(match: re.Match[str]) -> str:
    separator = match.group("sep1") or match.group("sep2") or match.group("sep3") or ""
    return separator + REDACTED


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` without the given secrets (exactly) and without anything shaped like a credential."""
    for secret in sorted((s for s in secrets if s and len(s) >= _MIN_SECRET_CHARS), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return _PATTERNS.sub(_replace, text)


class RedactingFilter(logging.Filter):
    """Rewrites a record's message with credential shapes redacted (attach to a third-party logger)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record whose args do not fit its format: leave it to the handler
            return True
        cleaned = scrub(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True
