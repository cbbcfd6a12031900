"""The dashboard's recent-requests table and errors panel, in headless Chromium over the real gateway of
``conftest.py``: requests made here, with OpenAI's ``user``, show up in the table an admin sees and in their
own tenant's only; a stream the client walks away from shows as a failure; refusals are what ``/metrics`` counts."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI
from playwright.sync_api import Browser, Page
from prometheus_client import CollectorRegistry, Counter

from spillgate.gateway.observability.dashboard import panels
from spillgate.gateway.observability.dashboard.samples import Samples
from tests.dashboard import inproc, promtext
from tests.dashboard.browser import RENDER_TIMEOUT_MS, chromium, open_dashboard, shown
from tests.dashboard.conftest import ADMIN_KEY, ARTIFACTS, Stack
from tests.support.gateway import OTHER_KEY, TENANT_KEY


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as started:
        yield started


def screenshot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def ask(stack: Stack, key: str, user: str, model: str = "hybrid") -> str:
    """One chat completion with ``user`` set and a request id of our own; that id."""
    request_id = f"recent-{uuid.uuid4().hex[:12]}"
    with OpenAI(base_url=stack.url + "/v1", api_key=key, max_retries=0, timeout=30) as client:
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=4,
            user=user,
            extra_headers={"x-request-id": request_id},
        )
    return request_id


def walk_away(stack: Stack) -> str:
    """A stream the client closes after its first event: booked as ``client_disconnected``."""
    request_id = f"recent-gone-{uuid.uuid4().hex[:8]}"
    body = {"model": "hybrid", "messages": [{"role": "user", "content": "A long story."}], "max_tokens": 4000}
    headers = {"authorization": f"Bearer {TENANT_KEY}", "x-request-id": request_id}
    with httpx.stream(
        "POST", stack.url + "/v1/chat/completions", json={**body, "stream": True}, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        next(response.iter_lines())
    return request_id


def row_of(page: Page, request_id: str) -> dict[str, str]:
    """The recent-requests row of ``request_id``, waited for (the page refreshes every 2 s): header -> cell."""
    page.wait_for_selector(f'#panel-recent tr[data-request-id="{request_id}"]', timeout=RENDER_TIMEOUT_MS)
    headers = page.eval_on_selector_all("#panel-recent th", "ths => ths.map(th => th.textContent)")
    cells = page.eval_on_selector_all(
        f'#panel-recent tr[data-request-id="{request_id}"] td', "tds => tds.map(td => td.textContent)"
    )
    return dict(zip(headers, cells, strict=True))


def refreshed(page: Page, times: int) -> None:
    """Until the page has drawn fresh data ``times`` times."""
    deadline = time.monotonic() + RENDER_TIMEOUT_MS / 1000
    while int(page.get_attribute("body", "data-refreshes") or 0) < times:
        assert time.monotonic() < deadline, f"the page did not refresh {times} times"
        page.wait_for_timeout(100)


def own_logs(stack: Stack, key: str, **params: Any) -> list[dict[str, Any]]:
    response = httpx.get(stack.url + "/v1/spend/logs", params=params, headers={"authorization": f"Bearer {key}"})
    return response.json()["data"]


def test_an_admin_sees_a_request_made_here_with_its_user(stack: Stack, browser: Browser) -> None:
    request_id = ask(stack, TENANT_KEY, "alice@example.com")
    page = open_dashboard(browser, stack.url, ADMIN_KEY)
    row = row_of(page, request_id)
    assert row["tenant"] == "tenant-a" and row["user"] == "alice@example.com" and row["outcome"] == "ok"
    assert row["route"] == "hybrid"
    (logged,) = [r for r in own_logs(stack, TENANT_KEY, user="alice@example.com") if r["request_id"] == request_id]
    assert row["backend"] == logged["backend"]
    numbers = shown(page)
    for shown_as, field in (
        ("prompt", "prompt_tokens"),
        ("cached", "cached_tokens"),
        ("output", "completion_tokens"),
        ("cost", "cost_usd"),
    ):
        value, _ = numbers[f"recent.{logged['id']}.{shown_as}"]
        assert float(value) == pytest.approx(logged[field], rel=1e-12), field
    screenshot(page, "dashboard-recent-admin.png")


def test_a_tenant_sees_only_its_own_requests(stack: Stack, browser: Browser) -> None:
    mine = ask(stack, OTHER_KEY, "bob")
    theirs = ask(stack, TENANT_KEY, "carol")
    page = open_dashboard(browser, stack.url, OTHER_KEY)
    row = row_of(page, mine)
    assert row["user"] == "bob" and "tenant" not in row, "a tenant's table has no tenant column"
    refreshed(page, 2)  # theirs was booked before this refresh
    assert not page.query_selector(f'#panel-recent tr[data-request-id="{theirs}"]')
    html = page.content()
    assert "carol" not in html and "tenant-a" not in html and "alice@example.com" not in html
    shown_ids = page.eval_on_selector_all("#panel-recent tbody tr", "trs => trs.map(tr => tr.dataset.requestId)")
    assert set(shown_ids) <= {r["request_id"] for r in own_logs(stack, OTHER_KEY, limit=1000)}


def test_a_stream_cut_off_by_its_client_shows_as_an_error(stack: Stack, browser: Browser) -> None:
    gone = walk_away(stack)
    deadline = time.monotonic() + 10
    while not [r for r in own_logs(stack, TENANT_KEY) if r["request_id"] == gone]:
        assert time.monotonic() < deadline, "the cut-off stream was never booked"
        time.sleep(0.1)
    page = open_dashboard(browser, stack.url, TENANT_KEY)
    assert row_of(page, gone)["outcome"] == "client_disconnected"
    page.wait_for_selector('svg[data-chart="errors-time"] rect', state="attached")
    failed = [r for r in own_logs(stack, TENANT_KEY, limit=1000) if r["outcome"] != "ok"]
    numbers = shown(page)
    assert float(numbers["errors.window.total"][0]) == len(failed)
    assert float(numbers["errors.outcome.client_disconnected"][0]) == sum(
        1 for r in failed if r["outcome"] == "client_disconnected"
    )
    screenshot(page, "dashboard-errors-tenant.png")


def test_refusals_are_what_metrics_count(stack: Stack, browser: Browser) -> None:
    refused = httpx.post(stack.url + "/v1/chat/completions", json={"model": "hybrid"}, headers={"authorization": "x"})
    assert refused.status_code == 401
    samples = promtext.parse(stack.metrics())
    page = open_dashboard(browser, stack.url, ADMIN_KEY)
    counted = promtext.sum_by(samples, panels.REFUSALS, "status") if panels.REFUSALS in samples else {}
    if not counted:  # this gateway does not count refusals: the panel says so rather than show zeros
        assert "no refusals counted" in page.inner_text("#panel-errors")
        return
    assert counted.get("401", 0) >= 1
    shown_total = sum(float(v) for m, (v, _) in shown(page).items() if m.startswith("refusals."))
    assert shown_total >= sum(counted.values())  # the page read the registry after /metrics was read


def test_a_tenant_reads_only_its_own_refusals() -> None:
    registry = CollectorRegistry()
    counter = Counter("spillgate_refusals", "refusals", ["status", "code", "tenant"], registry=registry)
    counter.labels("429", "quota_exceeded", "tenant-a").inc(3)
    counter.labels("429", "quota_exceeded", "tenant-b").inc(5)
    counter.labels("401", "invalid_api_key", "").inc(2)
    samples = Samples.read(registry)
    assert panels.refusals(samples, "tenant-a") == {
        "rows": [{"status": "429", "code": "quota_exceeded", "requests": 3.0}],
        "total": 3.0,
    }
    everyone = panels.refusals(samples, None)
    assert everyone["total"] == 10 and everyone["rows"][0] == {
        "status": "429",
        "code": "quota_exceeded",
        "requests": 8.0,
    }


class LeakyLedger(inproc.FakeLedger):
    """A ledger that ignores the tenant it is asked for: the dashboard must still show a tenant its own only."""

    def recent(self, tenant: str | None, limit: int) -> list[dict[str, Any]]:
        rows = [
            {
                "id": f"e{i}",
                "request_id": f"r{i}",
                "time": 1.0e9 - i,
                "tenant": name,
                "route": "chat",
                "backend": "shared-0",
                "kind": "replica",
                "user": None,
                "outcome": "ok",
                "prompt_tokens": 1,
                "cached_tokens": 0,
                "completion_tokens": 1,
                "cost_usd": 0.0,
            }
            for i, name in enumerate(["tenant-a", "tenant-b", "vip"] * 3)
        ]
        return rows[:limit]

    def failures(self, tenant: str | None, bucket_s: int, since_s: float) -> list[dict[str, Any]]:
        return [{"t": since_s, "tenant": t, "outcome": "error", "requests": 2} for t in ("tenant-a", "vip")]


def test_a_ledger_that_ignores_the_tenant_leaks_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    gateway = inproc.state()
    inproc.use_ledger(monkeypatch, LeakyLedger(time.time()))
    with inproc.serving(gateway) as url:
        own = httpx.get(url + "/dashboard/api/data", headers={"authorization": f"Bearer {inproc.KEYS['tenant-a']}"})
        admin = httpx.get(url + "/dashboard/api/data", headers={"authorization": f"Bearer {inproc.ADMIN_KEY}"})
    mine = own.json()
    assert {r["tenant"] for r in mine["recent"]["rows"]} == {"tenant-a"} and len(mine["recent"]["rows"]) == 3
    failures = mine["errors"]["ledger"]
    assert failures["total"] == 2 and {r["tenant"] for r in failures["series"]} == {"tenant-a"}
    everyone = admin.json()
    assert len(everyone["recent"]["rows"]) == 9 and everyone["errors"]["ledger"]["by_outcome"] == {"error": 4}
