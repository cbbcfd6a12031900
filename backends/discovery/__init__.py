"""Replicas found at run time rather than listed in the config: what a source reports, and the sources.

A source (:mod:`backends.discovery.kubernetes`) follows one pool's replicas and reports the whole set it knows
each time it changes; the gateway keeps one owner of those sets (:mod:`gateway.control.discovery`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class DiscoveredReplica:
    """One replica a source found: the pod (or other unit) it is, and where it serves."""

    pod: str
    """Its name in the source (a pod's ``metadata.name``): stable while it lives, so its backend name is too."""
    url: str
    """``scheme://ip:port``, no path."""
