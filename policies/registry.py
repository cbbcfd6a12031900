"""Policies by the name a route's config gives them.

A policy module registers each of its policies with one :func:`register_policy` line: a name and a factory
that builds the policy from the route's settings for it. The config accepts exactly the registered names, so a
new policy is one module and one line; the built-in ones live in :mod:`policies.builtin`, which the package
loads first, so they keep their names and their place in listings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from spillgate.policies.engine import Policy

PolicyParams = Mapping[str, Any]
"""A route's settings for its policy by config field (``affinity``), only those the route sets, as plain data."""
PolicyFactory = Callable[[PolicyParams], Policy]

_FACTORIES: dict[str, PolicyFactory] = {}


class PolicyParamError(ValueError):
    """A route gives its policy a setting the policy does not take, or one it cannot use.

    ``param`` is the setting's path under the route (``affinity``, ``affinity.slack``), so the config error
    names the field as pydantic would."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


def register_policy(name: str, factory: PolicyFactory) -> PolicyFactory:
    """Make ``name`` a policy routes may name; refuses a second, different factory under a taken name, so a
    plug-in cannot silently replace a built-in policy."""
    factories = _FACTORIES
    known = factories.get(name)
    if known is not None and known is not factory:
        raise ValueError(f"policy {name!r} is already registered")
    factories[name] = factory
    return factory


def policy_names() -> tuple[str, ...]:
    """Every registered policy's name, in registration order (the built-in ones first)."""
    return tuple(_FACTORIES)


def build_policy(name: str, params: PolicyParams | None = None) -> Policy:
    """The named policy built from ``params``; ``KeyError`` for an unknown name, :class:`PolicyParamError` for
    settings its factory refuses."""
    return _FACTORIES[name](params or {})


def takes_no_params(name: str, params: PolicyParams) -> None:
    """Refuse every setting: for policies that have none."""
    if params:
        param = next(iter(params))
        raise PolicyParamError(param, f"{name} takes no {param!r} setting")
