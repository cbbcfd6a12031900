"""GPU cost as rent: replicas cost their hourly price busy or idle, and tenants' shares add up to it."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest

from spillgate.gateway.accounting.rent import PoolPrice, RentBook
from spillgate.gateway.control.config import parse_config
from spillgate.gateway.observability.dashboard.data import dashboard_data
from spillgate.gateway.state import build_state
from tests.support.gateway import OTHER_KEY, TENANT_KEY, gateway_config, start_gateway, start_replica

ADMIN_KEY = "sk-rent-admin"
USD_PER_HOUR = 3.0
"""Per replica: one H100."""


def rent_config(replica_urls: list[str]) -> dict:
    config = gateway_config(replica_urls)
    config["pools"][0] |= {"gpu_usd_per_hour": USD_PER_HOUR, "output_tokens_per_s": 1140}
    config["routes"][0]["reference_price"] = {"input_per_mtok": 3, "output_per_mtok": 15}
    config["admin"] = {"keys": [ADMIN_KEY]}
    return config


async def test_four_idle_replicas_for_a_minute_cost_exactly_their_rent() -> None:
    """The gateway's own rent book and dashboard figures, read a minute after the pool was configured."""
    closed = [f"http://127.0.0.{host}:9" for host in range(1, 5)]  # nothing is sent: idle replicas
    parsed = parse_config(rent_config(closed))
    state = build_state(parsed, {}, {})
    (pool,) = state.rent.report(time.time())
    minute_later = pool.since + 60
    admin = state.tenants.authenticate_admin(f"Bearer {ADMIN_KEY}")
    data = await dashboard_data(state, admin, window_s=3600, bucket_s=60, now=minute_later)
    (row,) = data["rent"]["pools"]
    assert row["rent_usd"] == 4 * USD_PER_HOUR / 60 == 0.2
    assert row["idle_usd"] == row["rent_usd"] and row["utilization"] == 0
    assert row["by_tenant"] == {} and row["usd_per_mtok"] is None and row["break_even_utilization"] is None
    saved = data["savings"]
    assert saved["unused_rent_usd"] == 0.2 and saved["savings_usd"] == -0.2, "an idle pool is pure cost"


def test_tenants_shares_add_up_to_the_rent(tmp_path: Path) -> None:
    replicas = [start_replica(tmp_path, "--time-scale", "0.02") for _ in range(4)]
    gateway = start_gateway(rent_config([r.url for r in replicas]), tmp_path)
    try:
        for key, model, count in ((TENANT_KEY, "chat", 6), (OTHER_KEY, "chat-rr", 3)):
            client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)
            for n in range(count):
                messages = [{"role": "user", "content": f"request {n}: " + "word " * 200}]
                client.chat.completions.create(model=model, messages=messages, max_tokens=50)
        data = httpx.get(gateway.url + "/dashboard/api/data", headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()
        (pool,) = data["rent"]["pools"]
        assert pool["replicas"] == 4
        assert pool["rent_usd"] == pytest.approx(4 * USD_PER_HOUR * (pool["until"] - pool["since"]) / 3600, rel=1e-12)
        shares = pool["by_tenant"]
        assert set(shares) == {"tenant-a", "tenant-b"}
        assert sum(shares.values()) == pytest.approx(pool["rent_usd"], rel=1e-12), "the shares are the whole rent"
        assert shares["tenant-a"] > shares["tenant-b"], "twice the requests, about twice the GPU time"
        assert 0 < pool["utilization"] < 1 and pool["idle_usd"] < pool["rent_usd"]
        assert pool["usd_per_mtok"] > 0 and pool["hosted_usd_per_mtok"] > 0
        # The route with a reference price has savings; the other has no baseline, so none are claimed.
        routes = {r["route"]: r for r in data["savings"]["routes"]}
        assert routes["chat"]["savings_usd"] == pytest.approx(
            routes["chat"]["hosted_equivalent_usd"] - routes["chat"]["rent_usd"]
        )
        assert routes["chat-rr"]["savings_usd"] is None and data["savings"]["unknown_routes"] == ["chat-rr"]
        metrics = httpx.get(gateway.url + "/metrics").text
        assert 'spillgate_pool_rent_usd{pool="pool"}' in metrics
        assert 'spillgate_pool_busy_replica_seconds{pool="pool"}' in metrics
    finally:
        gateway.stop()
        for replica in replicas:
            replica.stop()


def test_traffic_without_a_baseline_claims_no_hosted_price() -> None:
    """Requests of a route with neither a hosted model nor a reference price say nothing about what hosted
    would cost: the pool's hosted price per token and break-even come from the other traffic only."""
    book = RentBook([PoolPrice("pool", 2, USD_PER_HOUR, 20_000, 1_000)], now=0.0)
    book.used("pool", "t", "no-baseline", gpu_seconds=36.0, tokens=1_000_000, hosted_equivalent_usd=None)
    (pool,) = book.report(3600.0)
    assert pool.hosted_usd_per_mtok is None and pool.break_even_utilization is None
    assert pool.utilization == 36.0 / 7200 and pool.rent_usd == 6.0
    book.used("pool", "t", "priced", gpu_seconds=36.0, tokens=1_000_000, hosted_equivalent_usd=9.0)
    (pool,) = book.report(3600.0)
    assert pool.hosted_usd_per_mtok == 9.0, "per token of the traffic with a baseline"
    # Break-even: all 2M tokens at $9/Mtok would be $18 against $6 of rent at 1% utilization: a third of it.
    assert pool.break_even_utilization == pytest.approx(0.01 * 6.0 / 18.0)
