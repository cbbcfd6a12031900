"""Tests of what the official SDKs make of the gateway's answers fail on any warning the SDKs raise (a field of
the wrong type, a deprecated shape), but not on what another test on the same worker left to the garbage
collector: a socket (``ResourceWarning``) or a coroutine a library created and never awaited."""

from __future__ import annotations

import pytest

FAIL_ON_SDK_WARNINGS = pytest.mark.filterwarnings(
    "error", "ignore::ResourceWarning", "ignore:coroutine .* was never awaited:RuntimeWarning"
)
