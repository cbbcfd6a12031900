"""API keys to tenants. Keys are kept only as SHA-256 digests, so a lookup reveals nothing by its timing."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from gateway.config import TenantConfig
from gateway.errors import ApiError
from gateway.secrets import resolve_secret

ANONYMOUS = "anonymous"


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    routes: frozenset[str]
    """Canonical names of the routes this tenant may call; ``"*"`` allows all."""
    ttft_slo_s: float = float("inf")
    tpot_slo_s: float = float("inf")
    self_hosted_only: bool = False

    def may_use(self, route: str) -> bool:
        return "*" in self.routes or route in self.routes


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def resolve_key(spec: str) -> str:
    """A configured key as a digest: ``sha256:<hex>``, ``os.environ/NAME``, or a literal key."""
    if spec.startswith("sha256:"):
        return spec.removeprefix("sha256:").lower()
    return key_digest(resolve_secret(spec))


class TenantDirectory:
    """Finds the tenant behind a bearer key."""

    def __init__(self, tenants: list[TenantConfig], *, required: bool, route_aliases: dict[str, str]) -> None:
        self._required = required
        self._by_digest: dict[str, Tenant] = {}
        for config in tenants:
            # A tenant may name a route by any alias; it is then allowed the route under every name.
            tenant = Tenant(
                config.name,
                frozenset(route_aliases.get(r, r) for r in config.routes),
                ttft_slo_s=config.slo.ttft_ms / 1000,
                tpot_slo_s=config.slo.tpot_ms / 1000,
                self_hosted_only=config.residency == "self_hosted_only",
            )
            for spec in config.keys:
                self._by_digest[resolve_key(spec)] = tenant
        self._anonymous = Tenant(ANONYMOUS, frozenset({"*"}))

    def authenticate(self, authorization: str | None) -> Tenant:
        """The tenant for an ``Authorization`` header; 401 alike for a missing, malformed or unknown key."""
        if authorization and authorization[:7].lower() == "bearer ":
            tenant = self._by_digest.get(key_digest(authorization[7:].strip()))
            if tenant is not None:
                return tenant
        if not self._required:
            return self._anonymous
        raise ApiError(
            401, "Invalid or missing API key. Pass it as 'Authorization: Bearer <key>'.", code="invalid_api_key"
        )
