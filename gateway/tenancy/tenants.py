"""API keys to tenants. Keys are kept only as SHA-256 digests, so the config and memory hold no key and a
lookup's timing says nothing about which keys exist."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import time
from dataclasses import dataclass
from typing import Protocol

from spillgate.gateway.accounting import UNLIMITED, TenantLimits
from spillgate.gateway.control.config import AdminConfig, ConfigError, TenantConfig
from spillgate.gateway.control.secrets import MissingSecret, resolve_secret
from spillgate.gateway.errors import ApiError
from spillgate.gateway.tenancy.managed_keys import SECRET_PREFIX, KeyStoreUnavailable, ManagedKey

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
_KEY_STORE_DOWN = "API keys made through /admin/keys cannot be checked now (their store is unreachable). Retry later."


class ManagedKeyLookup(Protocol):
    """The keys made through ``/admin/keys`` (:class:`~.managed_keys_service.ManagedKeys`)."""

    def find(self, digest: str, now: float) -> ManagedKey | None:
        """The usable key with this digest; raises :class:`KeyStoreUnavailable` when it may not be trusted now."""
        ...

    def knows(self, digest: str) -> bool: ...


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
        self.managed: ManagedKeyLookup | None = None
        """The keys made through the admin API; the config's keys are looked up first."""
        self._keyed: dict[str, tuple[ManagedKey, Tenant]] = {}

    def config_key(self, digest: str) -> bool:
        """A key of the config file (a tenant's or an admin's): no managed key may have its digest."""
        return digest in self._by_digest or digest in self._admins

    def authenticate(self, authorization: str | None) -> Tenant:
        """The tenant for an ``Authorization`` header; 401 alike for a missing, malformed, unknown, revoked or
        expired key."""
        key = _bearer(authorization)
        if key is not None:
            digest = key_digest(key)
            tenant = self._by_digest.get(digest)
            if tenant is not None:
                return tenant
            if self.managed is not None and key.startswith(SECRET_PREFIX):
                tenant = self._managed_tenant(digest)
                if tenant is not None:
                    return tenant
                if self.managed.knows(digest):  # revoked or expired: never anonymous
                    raise ApiError(401, _INVALID_KEY, code="invalid_api_key")
        if not self._required:
            return self._anonymous
        raise ApiError(401, _INVALID_KEY, code="invalid_api_key")

    def _managed_tenant(self, digest: str) -> Tenant | None:
        """The tenant of a usable managed key: its tenant's own object, or (for a key with limits of its own)
        a copy carrying them, made once per key and config version."""
        assert self.managed is not None
        try:
            record = self.managed.find(digest, time.time())
        except KeyStoreUnavailable:
            raise ApiError(503, _KEY_STORE_DOWN, code="key_store_unavailable") from None
        if record is None:
            return None
        tenant = self.by_name.get(record.tenant)
        if tenant is None or record.limits.unlimited:
            return tenant  # a tenant the config no longer has: its keys are unknown keys
        cached = self._keyed.get(record.id)
        if cached is not None and cached[0] is record:
            return cached[1]
        limits = dataclasses.replace(tenant.limits, key_id=record.id, key_limits=record.limits.as_tenant_limits())
        keyed = dataclasses.replace(tenant, limits=limits)
        self._keyed[record.id] = (record, keyed)
        return keyed

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
        if digest in self._by_digest or (key is not None and self._is_managed(key, digest)):
            raise ApiError(403, "This endpoint needs an admin key.", code="admin_key_required")
        raise ApiError(401, _INVALID_KEY, code="invalid_api_key")

    def _is_managed(self, key: str, digest: str) -> bool:
        if self.managed is None or not key.startswith(SECRET_PREFIX):
            return False
        try:
            return self.managed.find(digest, time.time()) is not None
        except KeyStoreUnavailable:
            return False


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
