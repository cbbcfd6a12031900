"""The dashboard's data for one caller. Scoping is decided here, once: an admin sees every figure; a
tenant sees its own spend, failures and latest requests (from the ledger, the only per-tenant source), its
own refusals, and fleet health that carries no tenant's data: latency percentiles, cache hit rates and
replica load, without request or token counts, and without the replicas of pools dedicated to other tenants."""

from __future__ import annotations

import time
from typing import Any

from spillgate.gateway.capacity.api import capacity_report, report_json
from spillgate.gateway.observability.dashboard import panels
from spillgate.gateway.observability.dashboard.ledger import SpendLedger, spend_panel
from spillgate.gateway.observability.dashboard.requests import failures_panel, recent_panel
from spillgate.gateway.observability.dashboard.samples import Samples
from spillgate.gateway.state import GatewayState
from spillgate.gateway.tenancy.tenants import Admin, Tenant

REFRESH_S = 2.0
ADMIN_ONLY = "admin key required: these figures cover every tenant"


def hidden_backends(state: GatewayState, viewer: Tenant) -> set[str]:
    """Replicas of pools dedicated to tenants other than ``viewer``: their load is another tenant's traffic."""
    foreign = {
        pool
        for tenant in state.tenants.by_name.values()
        if tenant.name != viewer.name
        for pool in tenant.dedicated_pools
    }
    # By the pool each backend belongs to, not by its name: configured, discovered and simulated replicas are
    # named differently, and a pool's name may begin another's.
    backends = [*state.registry, *state.registry.draining()]
    return {b.name for b in backends if b.kind == "replica" and b.pool in foreign}


def ledger_of(state: GatewayState) -> SpendLedger | None:
    return getattr(state, "spend", None)


async def dashboard_data(
    state: GatewayState, viewer: Admin | Tenant, *, window_s: int, bucket_s: int, now: float | None = None
) -> dict[str, Any]:
    now = time.time() if now is None else now
    samples = Samples.read(state.metrics.registry)
    admin = isinstance(viewer, Admin)
    tenant = None if admin else viewer.name
    backends = list(state.registry) if admin else panels.visible(state.registry, hidden_backends(state, viewer))
    kinds = {b.name: b.kind for b in state.registry}
    data: dict[str, Any] = {
        "generated_at": now,
        "refresh_s": REFRESH_S,
        "viewer": {"role": "admin"} if admin else {"role": "tenant", "tenant": viewer.name},
        "ledger": await spend_panel(ledger_of(state), tenant, window_s=window_s, bucket_s=bucket_s, now=now),
        "errors": {
            "ledger": await failures_panel(ledger_of(state), tenant, window_s=window_s, bucket_s=bucket_s, now=now),
            "refusals": panels.refusals(samples, tenant),
        },
        "recent": await recent_panel(ledger_of(state), tenant),
        "latency": {
            "ttft": panels.latency(samples, "spillgate_ttft_seconds", backends, counts=admin),
            "tpot": panels.latency(samples, "spillgate_tpot_seconds", backends, counts=admin),
        },
        "cache": panels.cache_hits(samples, backends, counts=admin),
        "load": panels.load(backends),
    }
    if admin:
        pools = state.rent.report(now)
        baselined = {name for name, route in state.routes.items() if route.reference_price is not None}
        data |= {
            "spend": panels.spend(samples),
            "rent": panels.rent(pools),
            "capacity": report_json(capacity_report(state)),
            "savings": panels.savings(samples, pools, baselined),
            "requests": panels.requests_by_reason(samples, kinds),
            "complexity": panels.complexity(samples),
            "slo": panels.slo(samples),
            "tenant_labels": state.config.metrics.tenant_labels,
        }
    else:
        data |= {
            "spend": None,
            "rent": None,
            "capacity": None,
            "savings": None,
            "requests": None,
            "complexity": None,
            "slo": None,
            "restricted": ADMIN_ONLY,
        }
    return data
