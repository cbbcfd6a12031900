"""The dashboard in headless Chromium: a real gateway with real traffic, the key typed into the page, and
every number the page shows checked against ``/metrics``."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page

from tests.dashboard import inproc, promtext
from tests.dashboard.browser import chromium, open_dashboard, shown
from tests.dashboard.conftest import ADMIN_KEY, ARTIFACTS, Stack
from tests.support.gateway import TENANT_KEY

CHARTS = ("spend-kind", "savings", "ttft", "tpot", "requests", "slo", "cache", "load-in-flight", "load-kv")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as started:
        yield started


def number(text: str) -> float:
    """What a reader takes from ``$0.0016``, ``-$1,250.50``, ``$0.73/Mtok``, ``12.5 ms``, ``51.3%`` or ``3``."""
    match = re.fullmatch(r"(-?)\$?(-?[0-9.e+-]+)\s*(ms|%|/Mtok|/s)?", text.replace(",", ""))
    assert match, f"not a number: {text!r}"
    value = float(match[1] + match[2])
    return value / 1000 if match[3] == "ms" else value / 100 if match[3] == "%" else value


def check(numbers: dict[str, tuple[str, str]], metric: str, expected: float) -> None:
    """The exact figure behind the number equals ``expected``; the text shown rounds it."""
    assert metric in numbers, f"{metric} not on the page; it shows {sorted(numbers)}"
    value, text = numbers[metric]
    assert float(value) == pytest.approx(expected, rel=1e-9, abs=1e-15), metric
    assert number(text) == pytest.approx(expected, rel=1e-3, abs=5e-4 if text.endswith("%") else 5e-3), metric


def ledger_of(stack: Stack, key: str, *, requests: int | None = None) -> dict[str, Any]:
    """The ledger panel's data; with ``requests``, once the ledger holds that many (it may lag the metrics)."""
    deadline = time.monotonic() + 10
    while True:
        response = httpx.get(stack.url + "/dashboard/api/data", headers={"authorization": f"Bearer {key}"})
        ledger = response.json()["ledger"]
        held = ledger.get("totals", {}).get("requests")
        if requests is None or held is None or held >= requests or time.monotonic() > deadline:
            return ledger
        time.sleep(0.1)


def screenshot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def test_admin_page_shows_what_metrics_say(stack: Stack, browser: Browser) -> None:
    samples = promtext.parse(stack.metrics())
    by_reason = promtext.sum_by(samples, "spillgate_requests_total", "reason")
    assert by_reason == stack.reasons and by_reason.get("complex", 0) >= 2, "the traffic must include spills"
    ledger = ledger_of(stack, ADMIN_KEY, requests=sum(by_reason.values()))
    page = open_dashboard(browser, stack.url, ADMIN_KEY)
    for chart in CHARTS:
        page.wait_for_selector(f'svg[data-chart="{chart}"] rect', state="attached")
    numbers = shown(page)

    for reason, count in by_reason.items():
        check(numbers, f"requests.{reason}.total", count)
    check(numbers, "requests.total", sum(by_reason.values()))
    check(numbers, "requests.spilled", by_reason["complex"])
    spend = promtext.sum_by(samples, "spillgate_spend_usd_total", "kind")
    check(numbers, "spend.total", sum(spend.values()))
    check(numbers, "spend.kind.hosted", spend["hosted"])
    check(numbers, "spend.kind.replica", spend["replica"])
    # Savings count only the route with a hosted baseline; they pay its hosted spend and its share of the
    # rent, which grows by the second: it lies between what /metrics said before and after the page's read.
    equivalent = sum(v for labels, v in samples["spillgate_hosted_equivalent_usd_total"] if labels["route"] == "hybrid")
    check(numbers, "savings.equivalent", equivalent)
    saved, spent = (float(numbers[f"savings.{name}"][0]) for name in ("total", "spend"))
    assert saved == pytest.approx(equivalent - spent, rel=1e-9)
    assert spent >= spend["hosted"]
    rent_after = sum(v for _, v in promtext.parse(stack.metrics())["spillgate_pool_rent_usd"])
    rent_before = sum(v for _, v in samples["spillgate_pool_rent_usd"])
    assert rent_before <= float(numbers["rent.total"][0]) <= rent_after
    assert 0 <= float(numbers["rent.idle"][0]) <= float(numbers["rent.total"][0])
    samples_after = promtext.parse(stack.metrics())
    recommended = promtext.sum_by(samples_after, "spillgate_recommended_replicas", "pool")
    check(numbers, "capacity.pool.recommended", recommended["pool"])
    check(numbers, "capacity.pool.replicas", 2)
    money = {metric: text for metric, (_, text) in numbers.items() if "$" in text}
    assert money and not [t for t in money.values() if "e" in t], f"money in exponent notation: {money}"
    tenant_rent = sum(float(value) for metric, (value, _) in numbers.items() if metric.startswith("rent.tenant."))
    assert tenant_rent == pytest.approx(float(numbers["rent.total"][0]), rel=1e-9), "tenants' shares are the rent"
    backends = {labels["backend"] for labels, _ in samples["spillgate_ttft_seconds_bucket"]}
    first = stack.replicas[0]
    assert {first, "frontier"} <= backends
    for backend in backends:
        for q in (0.5, 0.95, 0.99):
            check(
                numbers,
                f"ttft.{backend}.p{round(q * 100)}",
                promtext.quantile(q, samples, "spillgate_ttft_seconds", backend),
            )
    tokens = {(labels["backend"], labels["kind"]): v for labels, v in samples["spillgate_prompt_tokens_total"]}
    check(numbers, f"cache.{first}.hit_rate", tokens[first, "cached"] / tokens[first, "prompt"])
    slo = promtext.sum_by(samples, "spillgate_slo_requests_total", "result")
    check(numbers, "slo.default.attainment", slo.get("met", 0) / sum(slo.values()))
    check(numbers, f"load.{first}.in_flight", 0)
    assert numbers[f"load.{first}.healthy"][1] == "up"

    if ledger["configured"]:
        # The durable ledger and the metrics counted the same requests.
        assert ledger["window"]["usd"] == pytest.approx(sum(spend.values()), rel=1e-6)
        check(numbers, "ledger.window.usd", ledger["window"]["usd"])
        check(numbers, "ledger.window.hosted_usd", ledger["window"]["hosted_usd"])
        assert {r["tenant"] for r in ledger["series"] if r["usd"]} == {"tenant-a", "tenant-b", "resident"}
        page.wait_for_selector('svg[data-chart="spend-time-kind"] rect', state="attached")
    else:
        assert "ledger not configured" in page.inner_text("#panel-spend-time")
    assert page.inner_text("#viewer") == "admin: all tenants"
    screenshot(page, "dashboard-admin.png")


def test_tenant_page_shows_only_its_tenant(stack: Stack, browser: Browser) -> None:
    ledger = ledger_of(stack, TENANT_KEY)
    page = open_dashboard(browser, stack.url, TENANT_KEY)
    page.wait_for_selector('svg[data-chart="ttft"] rect', state="attached")
    assert page.get_attribute("body", "data-viewer") == "tenant:tenant-a"
    numbers = shown(page)
    assert not [m for m in numbers if m.split(".")[0] in ("requests", "spend", "savings", "slo")]
    assert not [m for m in numbers if m.endswith((".count", "prompt_tokens", "cached_tokens"))]
    samples = promtext.parse(stack.metrics())
    first = stack.replicas[0]
    check(numbers, f"ttft.{first}.p50", promtext.quantile(0.5, samples, "spillgate_ttft_seconds", first))
    assert "admin key required" in page.inner_text("#panel-requests")
    if ledger["configured"]:
        assert {r["tenant"] for r in ledger["series"]} == {"tenant-a"}
        check(numbers, "ledger.window.usd", ledger["window"]["usd"])
    html = page.content()
    for other in ("tenant-b", "resident", "all tenants"):
        assert other not in html
    screenshot(page, "dashboard-tenant.png")


def test_a_wrong_key_is_asked_for_again(stack: Stack, browser: Browser) -> None:
    page = browser.new_context().new_page()
    page.goto(stack.url + "/dashboard")
    page.fill("#key-input", "sk-not-a-key")
    page.click("#key-submit")
    page.wait_for_selector("#key-dialog[open]")
    page.wait_for_function("document.getElementById('key-error').textContent.length > 0")
    assert "Invalid or missing API key" in page.inner_text("#key-error")
    assert page.evaluate("sessionStorage.length") == 0


def test_spend_over_time_from_the_ledger(browser: Browser, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger's panels, drawn from a stand-in ledger on an in-process gateway."""
    gateway = inproc.state()
    inproc.record_traffic(gateway)
    ledger = inproc.FakeLedger(time.time())
    inproc.use_ledger(monkeypatch, ledger)
    with inproc.serving(gateway) as url:
        admin = open_dashboard(browser, url, inproc.ADMIN_KEY)
        for chart in ("spend-time-kind", "spend-time-tenant", "savings-time"):
            admin.wait_for_selector(f'svg[data-chart="{chart}"] path, svg[data-chart="{chart}"] rect', state="attached")
        numbers = shown(admin)
        check(numbers, "ledger.window.usd", sum(r["usd"] for r in ledger.rows))
        check(numbers, "ledger.totals.usd", ledger.totals(None)["usd"])
        check(numbers, "spend.tenant.vip", 1.0)
        assert "this month" in admin.inner_text("#panel-spend-time")
        legend = admin.inner_text('svg[data-chart="spend-time-tenant"] + .legend')
        assert "tenant-a" in legend and "tenant-b" in legend
        screenshot(admin, "dashboard-ledger-admin.png")

        tenant = open_dashboard(browser, url, inproc.KEYS["tenant-a"])
        tenant.wait_for_selector('svg[data-chart="spend-time-kind"] rect', state="attached")
        numbers = shown(tenant)
        mine = [r for r in ledger.rows if r["tenant"] == "tenant-a"]
        check(numbers, "ledger.window.hosted_usd", sum(r["usd"] for r in mine if r["kind"] == "hosted"))
        check(numbers, "ledger.window.savings_usd", sum(r["hosted_equivalent_usd"] - r["usd"] for r in mine))
        html = tenant.content()
        assert "tenant-b" not in html and "vip" not in html
