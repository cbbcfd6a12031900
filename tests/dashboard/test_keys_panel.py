"""The dashboard's API keys panel in headless Chromium: an admin sees the managed keys by id, never a key; a
tenant does not see the panel at all."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser

from tests.dashboard.browser import chromium, open_dashboard
from tests.dashboard.conftest import ADMIN_KEY, Stack
from tests.support.gateway import TENANT_KEY


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as started:
        yield started


def make_key(stack: Stack, **body: object) -> dict[str, str]:
    response = httpx.post(
        stack.url + "/admin/keys", json={"tenant": "tenant-a", **body}, headers={"authorization": f"Bearer {ADMIN_KEY}"}
    )
    assert response.status_code == 201, response.text
    return response.json()


def test_an_admin_sees_each_managed_key_by_id_and_never_the_key(stack: Stack, browser: Browser) -> None:
    kept = make_key(stack, name="build bot")
    revoked = make_key(stack)
    httpx.delete(stack.url + f"/admin/keys/{revoked['id']}", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    page = open_dashboard(browser, stack.url, ADMIN_KEY)
    page.wait_for_selector(f'#panel-keys tr[data-key="{revoked["id"]}"]', timeout=15_000)
    row = page.inner_text(f'#panel-keys tr[data-key="{kept["id"]}"]')
    assert kept["id"] in row and kept["prefix"] in row and "build bot" in row and "tenant-a" in row
    assert "active" in row
    assert "revoked" in page.inner_text(f'#panel-keys tr[data-key="{revoked["id"]}"]')
    panel = page.inner_text("#panel-keys")
    assert kept["key"] not in panel and revoked["key"] not in panel


def test_a_tenant_does_not_see_the_keys_panel(stack: Stack, browser: Browser) -> None:
    make_key(stack)
    page = open_dashboard(browser, stack.url, TENANT_KEY)
    page.wait_for_selector('svg[data-chart="ttft"] rect', state="attached")
    assert page.is_hidden("#panel-keys")
    assert page.inner_text("#panel-keys .body") == ""
