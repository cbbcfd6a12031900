"""The data endpoint in process: who may read it, what each caller gets, the ledger seam, and that figures
equal the ones ``/metrics`` renders."""

from __future__ import annotations

import math
import time
import tomllib
from collections.abc import AsyncIterator
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client import generate_latest

from spillgate.gateway.app import GatewayApp
from spillgate.gateway.observability.dashboard.assets import MEDIA_TYPES
from spillgate.gateway.state import GatewayState
from tests.dashboard import inproc, promtext

DATA = "/dashboard/api/data"


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch) -> GatewayState:
    state = inproc.state()
    inproc.record_traffic(state)
    inproc.use_ledger(monkeypatch, None)  # each test that wants a ledger brings its own
    return state


@pytest.fixture
async def client(gateway: GatewayState) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=GatewayApp(gateway))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
        yield c


async def get(client: httpx.AsyncClient, key: str | None, **params: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return await client.get(DATA, headers=headers, params=params)


async def test_data_needs_a_known_key(client: httpx.AsyncClient) -> None:
    for key in (None, "sk-unknown"):
        response = await get(client, key)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"


async def test_admin_sees_every_tenant(client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = inproc.FakeLedger(time.time())
    inproc.use_ledger(monkeypatch, ledger)
    data = (await get(client, inproc.ADMIN_KEY)).json()
    assert data["viewer"] == {"role": "admin"}
    assert data["spend"]["by_tenant"] == {"tenant-a": 0.25, "tenant-b": 0.5, "vip": 1.0}
    assert data["requests"]["total"] == 5
    assert {r["slo_class"]: r["attainment"] for r in data["slo"]} == {"gold": 1.0, "silver": 0.0}
    assert [r["backend"] for r in data["load"]] == [*inproc.SHARED, inproc.VIP]
    assert data["ledger"]["tenants"] == ["tenant-a", "tenant-b"]
    assert data["ledger"]["totals_period"] == "month" and "window" not in data["ledger"]["totals"]
    assert ledger.calls[0] == ("series", (None, 60, pytest.approx(time.time() - 3600, abs=61)))


async def test_a_tenant_sees_its_own_spend_and_no_other_tenant(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = inproc.FakeLedger(time.time())
    inproc.use_ledger(monkeypatch, ledger)
    response = await get(client, inproc.KEYS["tenant-a"])
    data = response.json()
    assert data["viewer"] == {"role": "tenant", "tenant": "tenant-a"}
    assert ("series", ("tenant-a", 60, pytest.approx(time.time() - 3600, abs=61))) in ledger.calls
    assert {r["tenant"] for r in data["ledger"]["series"]} == {"tenant-a"}
    assert data["ledger"]["window"]["usd"] == pytest.approx(
        sum(r["usd"] for r in ledger.rows if r["tenant"] == "tenant-a")
    )
    # Nothing fleet-wide that counts other tenants' requests or money; no replica dedicated to another tenant.
    assert data["spend"] is data["requests"] is data["slo"] is data["savings"] is None
    assert all("count" not in row for row in data["latency"]["ttft"])
    assert all("prompt_tokens" not in row for row in data["cache"])
    text = response.text
    for other in ("tenant-b", "vip", "silver"):
        assert other not in text


async def test_a_ledger_that_ignores_the_tenant_still_leaks_nothing(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Leaky(inproc.FakeLedger):
        def series(self, tenant: str | None, bucket_s: int, since_s: float) -> list[dict[str, Any]]:
            return super().series(None, bucket_s, since_s)

        def totals(self, tenant: str | None) -> dict[str, Any]:
            return {"usd": 1.0, "by_tenant": {"tenant-b": 0.5}}

    inproc.use_ledger(monkeypatch, Leaky(time.time()))
    response = await get(client, inproc.KEYS["tenant-a"])
    assert "tenant-b" not in response.text
    assert response.json()["ledger"]["totals"] == {"usd": 1.0}


async def test_without_a_ledger_the_panel_says_so(client: httpx.AsyncClient) -> None:
    for key in (inproc.ADMIN_KEY, inproc.KEYS["tenant-a"]):
        ledger = (await get(client, key)).json()["ledger"]
        assert ledger == {"configured": False, "message": "ledger not configured"}


async def test_a_failing_or_async_ledger(client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken(inproc.FakeLedger):
        def series(self, tenant: str | None, bucket_s: int, since_s: float) -> list[dict[str, Any]]:
            raise OSError("disk gone")

    inproc.use_ledger(monkeypatch, Broken(time.time()))
    response = await get(client, inproc.ADMIN_KEY)
    assert response.status_code == 200
    assert response.json()["ledger"] == {"configured": True, "error": "ledger unavailable: OSError"}
    assert response.json()["requests"]["total"] == 5  # the rest of the page still works

    class Async(inproc.FakeLedger):
        async def series(self, tenant: str | None, bucket_s: int, since_s: float) -> list[dict[str, Any]]:  # type: ignore[override]
            return super().series(tenant, bucket_s, since_s)

    inproc.use_ledger(monkeypatch, Async(time.time()))
    assert len((await get(client, inproc.ADMIN_KEY)).json()["ledger"]["series"]) == 15


async def test_rows_without_a_baseline_show_no_savings(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = inproc.FakeLedger(time.time())
    for row in ledger.rows[:1]:
        del row["hosted_equivalent_usd"]
    inproc.use_ledger(monkeypatch, ledger)
    window = (await get(client, inproc.ADMIN_KEY)).json()["ledger"]["window"]
    assert window["usd"] == pytest.approx(sum(r["usd"] for r in ledger.rows))
    assert window["hosted_equivalent_usd"] is None and window["savings_usd"] is None


async def test_figures_equal_what_metrics_renders(client: httpx.AsyncClient, gateway: GatewayState) -> None:
    data = (await get(client, inproc.ADMIN_KEY)).json()
    samples = promtext.parse(generate_latest(gateway.metrics.registry).decode())
    for histogram, rows in (
        ("spillgate_ttft_seconds", data["latency"]["ttft"]),
        ("spillgate_tpot_seconds", data["latency"]["tpot"]),
    ):
        for row in rows:
            for q in (0.5, 0.95, 0.99):
                expected = promtext.quantile(q, samples, histogram, row["backend"])
                assert row[f"p{round(q * 100)}"] == pytest.approx(expected, rel=1e-12)
    spend = sum(v for _, v in samples["spillgate_spend_usd_total"])
    assert data["spend"]["total_usd"] == pytest.approx(spend, rel=1e-12)
    assert {r["backend"]: r["hit_rate"] for r in data["cache"]} == {
        inproc.SHARED[0]: 0.4,
        inproc.SHARED[1]: None,
        inproc.VIP: 0.0,
    }


async def test_complex_asks_show_their_share_and_spend_per_route(
    client: httpx.AsyncClient, gateway: GatewayState
) -> None:
    gateway.metrics.requests.labels("chat", "frontier", "ok", "complex").inc(5)
    gateway.metrics.spend.labels("tenant-a", "chat", "frontier", "hosted", "complex").inc(0.75)
    data = (await get(client, inproc.ADMIN_KEY)).json()
    (chat,) = data["complexity"]["routes"]
    assert chat == {"route": "chat", "requests": 10, "complex": 5, "complex_share": 0.5, "complex_spend_usd": 0.75}
    assert (await get(client, inproc.KEYS["tenant-a"])).json()["complexity"] is None


async def test_window_and_bucket_are_bounded(client: httpx.AsyncClient) -> None:
    response = await get(client, inproc.ADMIN_KEY, window_s=86400, bucket_s=1)
    assert response.status_code == 422 and response.json()["error"]["param"] == "bucket_s"
    response = await get(client, inproc.ADMIN_KEY, window_s=10)
    assert response.status_code == 422 and response.json()["error"]["param"] == "window_s"


async def test_the_page_and_its_assets_come_from_the_gateway(client: httpx.AsyncClient) -> None:
    page = await client.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert '<script type="module" src="/dashboard/static/dashboard.js">' in page.text
    for name, kind in (
        ("dashboard.js", "text/javascript"),
        ("charts.js", "text/javascript"),
        ("dashboard.css", "text/css"),
    ):
        asset = await client.get(f"/dashboard/static/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
    for missing in ("/dashboard/static/nope.js", "/dashboard/static/..%2f__init__.py"):
        response = await client.get(missing)
        assert response.status_code == 404 and "error" in response.json()


def test_nan_never_reaches_json() -> None:
    assert orjson.loads(orjson.dumps({"p50": math.nan})) == {"p50": None}


def test_every_page_file_is_package_data() -> None:
    """A wheel carries only the listed patterns: a page file outside them would 404 once installed."""
    root = Path(__file__).resolve().parents[2]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    static = root / "gateway" / "observability" / "dashboard" / "static"
    for name in MEDIA_TYPES:
        assert (static / name).is_file(), name
        assert any(fnmatch(f"static/{name}", p) for p in patterns["spillgate.gateway.observability.dashboard"]), name
    assert sorted(p.name for p in static.iterdir()) == sorted(MEDIA_TYPES), "every file is served by name"
