"""A managed key's record: what the admin API created, kept as a digest only, and what it may still do.

The key itself is shown once, when it is made; the record holds its SHA-256 digest, which is all a lookup needs.
Revoking sets ``revoked_at``; a rotation's grace period is a revocation in the future."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from spillgate.gateway.accounting import UNLIMITED, TenantLimits

SECRET_PREFIX = "sk-sg-"
"""Every managed key starts so: only such keys are looked up among the managed ones."""
_SECRET_BYTES = 32
_SHOWN_PREFIX = 8
"""Characters of the key after ``sk-sg-`` kept to tell keys apart in listings (48 random bits: no secret)."""


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """A key's own limits, enforced besides its tenant's; ``None`` means none of that kind."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    usd_per_day: float | None = None
    usd_per_month: float | None = None

    @property
    def unlimited(self) -> bool:
        return all(v is None for v in (self.requests_per_minute, self.tokens_per_minute)) and not self.has_budget

    @property
    def has_budget(self) -> bool:
        return self.usd_per_day is not None or self.usd_per_month is not None

    def as_tenant_limits(self) -> TenantLimits:
        """These limits in the accounting's terms, for the per-key subject's reservations."""
        if self.unlimited:
            return UNLIMITED
        return TenantLimits(
            requests_per_minute=self.requests_per_minute,
            tokens_per_minute=self.tokens_per_minute,
            usd_per_day=self.usd_per_day,
            usd_per_month=self.usd_per_month,
        )


@dataclass(frozen=True, slots=True)
class ManagedKey:
    id: str
    digest: str
    tenant: str
    prefix: str
    created_at: float
    name: str | None = None
    expires_at: float | None = None
    revoked_at: float | None = None
    """When it stops working: now for a revocation, later for a rotation's grace period; None while it works."""
    limits: KeyLimits = field(default_factory=KeyLimits)
    rotated_from: str | None = None
    replaced_by: str | None = None

    def usable(self, now: float) -> bool:
        """Neither revoked nor expired at ``now``."""
        revoked = self.revoked_at is not None and self.revoked_at <= now
        expired = self.expires_at is not None and self.expires_at <= now
        return not (revoked or expired)

    def revoked(self, at: float, replaced_by: str | None = None) -> ManagedKey:
        """This key revoked at ``at`` (kept earlier when it already was)."""
        when = at if self.revoked_at is None else min(self.revoked_at, at)
        return replace(self, revoked_at=when, replaced_by=replaced_by or self.replaced_by)

    def to_json(self) -> dict[str, Any]:
        """The stored form, digest included: never sent to a client."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ManagedKey:
        limits = KeyLimits(**data.get("limits") or {})
        return cls(**{**data, "limits": limits})

    def public(self, now: float, last_used: float | None = None) -> dict[str, Any]:
        """What the admin API shows: never the key or its digest."""
        return {
            "object": "api_key",
            "id": self.id,
            "prefix": self.prefix,
            "name": self.name,
            "tenant": self.tenant,
            "created_at": _whole(self.created_at),
            "expires_at": _whole(self.expires_at),
            "revoked_at": _whole(self.revoked_at),
            "revoked": self.revoked_at is not None and self.revoked_at <= now,
            "expired": self.expires_at is not None and self.expires_at <= now,
            "active": self.usable(now),
            "last_used_at": _whole(last_used),
            "limits": {
                "requests_per_minute": self.limits.requests_per_minute,
                "tokens_per_minute": self.limits.tokens_per_minute,
            },
            "budget": {"usd_per_day": self.limits.usd_per_day, "usd_per_month": self.limits.usd_per_month},
            "rotated_from": self.rotated_from,
            "replaced_by": self.replaced_by,
        }


class KeyStoreUnavailable(Exception):
    """Redis is unreachable: keys cannot be changed now (or, ``fail_closed``, used)."""


def _whole(t: float | None) -> int | None:
    return None if t is None else int(t)


def new_secret() -> str:
    """A new key: ``sk-sg-`` and 32 random bytes, URL-safe base64 (43 characters)."""
    return SECRET_PREFIX + secrets.token_urlsafe(_SECRET_BYTES)


def new_key_id() -> str:
    return "key_" + secrets.token_hex(12)


def make_key(
    tenant: str,
    now: float,
    *,
    name: str | None = None,
    expires_at: float | None = None,
    limits: KeyLimits | None = None,
    rotated_from: str | None = None,
) -> tuple[str, ManagedKey]:
    """A new secret and its record; the secret goes to the caller once and is kept nowhere."""
    secret = new_secret()
    record = ManagedKey(
        id=new_key_id(),
        digest=hashlib.sha256(secret.encode()).hexdigest(),  # as tenants.key_digest
        tenant=tenant,
        prefix=secret[len(SECRET_PREFIX) : len(SECRET_PREFIX) + _SHOWN_PREFIX],
        created_at=now,
        name=name,
        expires_at=expires_at,
        limits=limits or KeyLimits(),
        rotated_from=rotated_from,
    )
    return secret, record
