"""Debian's chromium, driven by Playwright: found where the system installed it, installed with apt when it
is missing and we may, and otherwise the browser tests are skipped with the reason. Playwright's own
browser downloads are never used."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"
RENDER_TIMEOUT_MS = 15_000


def find_chromium() -> str | None:
    for candidate in (os.environ.get("SPILLGATE_CHROMIUM"), CHROMIUM, shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _install() -> str:
    """Try ``apt-get install chromium``; the reason it could not, or an empty string."""
    if os.geteuid() != 0:
        return "not root, so apt-get cannot install it"
    if shutil.which("apt-get") is None:
        return "no apt-get on this system"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{' '.join(command)}: {exc}"
        if done.returncode != 0:
            return f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()[-300:]}"
    return ""


def chromium_or_skip() -> str:
    path = find_chromium()
    if path is None:
        problem = _install()
        path = find_chromium()
        if path is None:
            pytest.skip(
                f"browser test needs Debian's chromium at {CHROMIUM} (or SPILLGATE_CHROMIUM): not found, and "
                f"installing it failed ({problem or 'installed, but still not found'}); `make test` as root "
                "installs it"
            )
    return path


@contextmanager
def chromium() -> Iterator[Browser]:
    executable = chromium_or_skip()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def open_dashboard(browser: Browser, url: str, key: str) -> Page:
    """A fresh tab (its own session storage) on ``/dashboard``, the key entered as a user would, charts drawn."""
    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(url + "/dashboard")
    page.wait_for_selector("#key-dialog[open]", timeout=RENDER_TIMEOUT_MS)
    page.fill("#key-input", key)
    page.click("#key-submit")
    page.wait_for_selector("body[data-refreshes]", timeout=RENDER_TIMEOUT_MS)
    assert not errors, f"the page logged errors: {errors}"
    return page


def shown(page: Page) -> dict[str, tuple[str, str]]:
    """Every number on the page: ``data-metric`` -> (exact ``data-value``, text the user sees)."""
    rows = page.eval_on_selector_all(
        "[data-metric]", "els => els.map(e => [e.dataset.metric, e.dataset.value, e.textContent.trim()])"
    )
    return {metric: (value, text) for metric, value, text in rows}
