"""Secrets in the config: literal values, or ``os.environ/NAME`` like litellm's own config."""

from __future__ import annotations

import os

ENV_PREFIX = "os.environ/"


class MissingSecret(ValueError):
    """The config names an environment variable that is not set."""


def resolve_secret(spec: str) -> str:
    if not spec.startswith(ENV_PREFIX):
        return spec
    name = spec.removeprefix(ENV_PREFIX)
    value = os.environ.get(name)
    if not value:
        raise MissingSecret(f"environment variable {name} is not set")
    return value
