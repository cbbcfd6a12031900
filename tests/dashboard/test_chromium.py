"""Without chromium the browser tests skip, saying why, and only after trying to install it."""

from __future__ import annotations

import pytest

from tests.dashboard import browser


def test_missing_chromium_that_cannot_be_installed_skips_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPILLGATE_CHROMIUM", raising=False)
    monkeypatch.setattr(browser, "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setattr(browser.shutil, "which", lambda _: None)
    monkeypatch.setattr(browser.os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.skip.Exception, match=r"not found, and installing it failed \(not root"):
        browser.chromium_or_skip()


def test_chromium_is_found_where_debian_puts_it_or_where_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPILLGATE_CHROMIUM", "/bin/sh")  # any executable: only the lookup is under test
    assert browser.find_chromium() == "/bin/sh"
