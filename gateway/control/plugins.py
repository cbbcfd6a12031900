"""Policies and engines from outside this package, loaded before the config is read.

A plug-in module registers what it defines when it is imported (``register_policy``, ``register_engine``), so the
config can name it. Two ways in: an installed distribution's entry points in the ``spillgate.plugins`` group, and
``spillgate serve --plugin MODULE``. Only the command line and installed packages load code: a config edit through
the admin API can name what is loaded, never load something new.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from importlib.metadata import entry_points

ENTRY_POINT_GROUP = "spillgate.plugins"


class PluginError(Exception):
    """A plug-in module could not be imported."""


def load_plugins(modules: Sequence[str] = ()) -> list[str]:
    """Import every installed plug-in, then ``modules``; returns the names loaded, in order."""
    loaded = []
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()
        except Exception as exc:
            raise PluginError(f"plug-in {entry.name} ({entry.value}) failed to load: {exc}") from exc
        loaded.append(entry.value)
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise PluginError(f"plug-in module {name} failed to load: {exc}") from exc
        loaded.append(name)
    return loaded
