"""API keys to tenants. Keys are kept only as SHA-256 digests, so the config and memory hold no key and a
lookup's timing says nothing about which keys exist."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from spillgate.gateway.accounting import UNLIMITED, TenantLimits
from spillgate.gateway.control.config import AdminConfig, ConfigError, TenantConfig
from spillgate.gateway.control.secrets import MissingSecret, resolve_secret
from spillgate.gateway.errors import ApiError

ANONYMOUS = "anonymous"
_SALT_SEPARATOR = "|"
"""Not allowed in tenant names, so no tenant can produce a cache salt in another tenant's namespace."""


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    routes: frozenset[str]
    """Canonical names of the routes this tenant may call; ``"*"`` allows all."""
    ttft_slo_s: float = float("inf")
    tpot_slo_s: float = float("inf")
    slo_class: str = "default"
    self_hosted_only: bool = False
    priority: str = "normal"
    isolation: str = "shared"
    dedicated_pools: frozenset[str] = frozenset()
    limits: TenantLimits = UNLIMITED
    """Rate limits and budgets, reserved before each request is sent."""
    hosted_over_budget: str = "self_hosted"
    """Past a hosted budget: ``self_hosted`` keeps serving on replicas, ``reject`` answers 429."""

    def may_use(self, route: str) -> bool:
        return "*" in self.routes or route in self.routes

    def cache_salt(self, requested: object) -> str | None:
        """The ``cache_salt`` the replica gets: a client's own salt, confined to its tenant's namespace; without
        one, ``salted``/``dedicated`` tenants get their tenant's, ``shared`` ones none."""
        if isinstance(requested, str) and requested:
            return self.name + _SALT_SEPARATOR + requested
        return None if self.isolation == "shared" else self.name + _SALT_SEPARATOR


@dataclass(frozen=True, slots=True)
class Admin:
    """A caller holding an admin key: the admin API and every tenant's spend, but no completions."""

    key_id: str
    """The first characters of the key's digest: enough to tell keys apart in the config history."""
    digest: str = ""
    """The whole digest: a config change made with this key must keep it (:mod:`gateway.control.live_config`)."""


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def resolve_key(spec: str) -> str:
    """A configured key as a digest: ``sha256:<hex>``, ``os.environ/NAME``, or a literal key."""
    if spec.startswith("sha256:"):
        return spec.removeprefix("sha256:").lower()
    return key_digest(resolve_secret(spec))


def require_metrics_token(token: str | None, authorization: str | None, path: str) -> None:
    """401 unless ``metrics.token`` is unset or ``authorization`` carries it: the scrape endpoints' one guard."""
    if token is not None and not bearer_matches(authorization, token):
        raise ApiError(401, f"{path} needs the metrics token: 'Authorization: Bearer <token>'.", code="invalid_api_key")


def bearer_matches(authorization: str | None, spec: str) -> bool:
    """The ``Authorization`` header carries the key ``spec`` configures (compared in constant time)."""
    key = _bearer(authorization)
    if key is None:
        return False
    try:
        expected = resolve_key(spec)
    except MissingSecret:
        return False
    return hmac.compare_digest(key_digest(key), expected)


def _bearer(authorization: str | None) -> str | None:
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return None


_INVALID_KEY = "Invalid or missing API key. Pass it as 'Authorization: Bearer <key>'."


class TenantDirectory:
    """Finds the tenant (or admin) behind a bearer key."""

    def __init__(
        self,
        tenants: list[TenantConfig],
        *,
        required: bool,
        route_aliases: dict[str, str],
        admin: AdminConfig | None = None,
    ) -> None:
        self._required = required
        self._by_digest: dict[str, Tenant] = {}
        self.by_name: dict[str, Tenant] = {}
        self._admins: dict[str, Admin] = {}
        problems: list[tuple[str, str]] = []
        owners: dict[str, str] = {}
        for i, config in enumerate(tenants):
            tenant = _tenant_from(config, route_aliases)
            self.by_name[tenant.name] = tenant
            for j, spec in enumerate(config.keys):
                digest = _digest_or_problem(spec, f"tenants.{i}.keys.{j}", problems)
                if digest in owners and owners[digest] != tenant.name:
                    problems.append((f"tenants.{i}.keys.{j}", f"already a key of tenant {owners[digest]!r}"))
                elif digest:
                    owners[digest] = tenant.name
                    self._by_digest[digest] = tenant
        for j, spec in enumerate(admin.keys if admin else []):
            digest = _digest_or_problem(spec, f"admin.keys.{j}", problems)
            if digest in owners:
                problems.append((f"admin.keys.{j}", "an admin key must not also be a tenant key"))
            elif digest:
                self._admins[digest] = Admin(digest[:12], digest)
        if problems:
            raise ConfigError.listing(problems)
        self._anonymous = Tenant(ANONYMOUS, frozenset({"*"}))

    def authenticate(self, authorization: str | None) -> Tenant:
        """The tenant for an ``Authorization`` header; 401 alike for a missing, malformed or unknown key."""
        key = _bearer(authorization)
        if key is not None:
            tenant = self._by_digest.get(key_digest(key))
            if tenant is not None:
                return tenant
        if not self._required:
            return self._anonymous
        raise ApiError(401, _INVALID_KEY, code="invalid_api_key")

    def authenticate_any(self, authorization: str | None) -> Tenant | Admin:
        """An admin or a tenant; for the endpoints both may read (the dashboard, spend)."""
        key = _bearer(authorization)
        if key is not None:
            digest = key_digest(key)
            admin = self._admins.get(digest)
            if admin is not None:
                return admin
        return self.authenticate(authorization)

    def authenticate_admin(self, authorization: str | None) -> Admin:
        """An admin, else 401 (no key or an unknown one) or 403 (a tenant key)."""
        key = _bearer(authorization)
        digest = key_digest(key) if key is not None else ""
        admin = self._admins.get(digest)
        if admin is not None:
            return admin
        if digest in self._by_digest:
            raise ApiError(403, "This endpoint needs an admin key.", code="admin_key_required")
        raise ApiError(401, _INVALID_KEY, code="invalid_api_key")


def _digest_or_problem(spec: str, where: str, problems: list[tuple[str, str]]) -> str:
    try:
        return resolve_key(spec)
    except MissingSecret as exc:
        problems.append((where, str(exc)))
        return ""


def _tenant_from(config: TenantConfig, route_aliases: dict[str, str]) -> Tenant:
    # A tenant may name a route by any alias; it is then allowed the route under every name.
    return Tenant(
        config.name,
        frozenset(route_aliases.get(r, r) for r in config.routes),
        ttft_slo_s=config.slo.ttft_ms / 1000,
        tpot_slo_s=config.slo.tpot_ms / 1000,
        slo_class=config.slo.name,
        self_hosted_only=config.residency == "self_hosted_only",
        priority=config.priority,
        isolation=config.isolation,
        dedicated_pools=frozenset(config.dedicated_pools),
        limits=TenantLimits(
            requests_per_minute=config.limits.requests_per_minute,
            tokens_per_minute=config.limits.tokens_per_minute,
            usd_per_day=config.budget.usd_per_day,
            usd_per_month=config.budget.usd_per_month,
            hosted_usd_per_day=config.budget.hosted_usd_per_day,
            hosted_usd_per_month=config.budget.hosted_usd_per_month,
        ),
        hosted_over_budget=config.budget.on_hosted_exceeded,
    )
