"""Where accounting lives in Redis. Every key of one tenant shares the hash tag ``{tenant}``, and
``SCAN <prefix>:acct:*`` finds them all. Each script also reads the epoch key (its fence, :mod:`.scripts`).

``<prefix>:acct:{t}:d:<YYYYMMDD>`` / ``:m:<YYYYMM>``  rollup hash: ``<scope>.<sum>`` (scope ``t``, ``k:<kind>``,
                                                       ``b:<backend>``) plus ``held`` / ``hosted_held``
``<prefix>:acct:{t}:s:<YYYYMMDD>``                    per-minute series: ``<minute>:<kind>.usd`` / ``.n``
``<prefix>:acct:{t}:ids:<YYYYMMDDHHMM>``              ledger entry ids already counted, per 10-minute slot of
                                                       the entry's time (idempotency; kept 2 h after the last)
``<prefix>:acct:{t}:ledger``                          stream of ledger entries
``<prefix>:acct:{t}:rate``                            GCRA state: ``rpm`` / ``tpm`` (microseconds)
``<prefix>:acct:{t}:holds`` / ``:hold-expiry``        open reservations and when they lapse
``<prefix>:acct:tenants``                             tenants with ledger entries (for ``/admin/spend``)
``<prefix>:acct:epoch``                               set when the rollups were started: gone means Redis lost them
``<prefix>:acct:{t}:rebuilt:<epoch>:<ledger>``        a ledger's totals were added back in that epoch
``<prefix>:acct:joined:<epoch>``                      the processes that have put back what they knew in that
                                                       epoch (a set of process ids)
"""

from __future__ import annotations


def _escape(tenant: str) -> str:
    """Braces would move the hash tag; ``%`` is escaped so the mapping stays one-to-one."""
    return tenant.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


class RedisKeys:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.tenants = f"{prefix}:acct:tenants"
        self.epoch = f"{prefix}:acct:epoch"

    def base(self, tenant: str) -> str:
        return f"{self.prefix}:acct:{{{_escape(tenant)}}}"

    def day(self, tenant: str, tag: str) -> str:
        return f"{self.base(tenant)}:d:{tag}"

    def month(self, tenant: str, tag: str) -> str:
        return f"{self.base(tenant)}:m:{tag}"

    def series(self, tenant: str, day: str) -> str:
        return f"{self.base(tenant)}:s:{day}"

    def ids(self, tenant: str, slot: str) -> str:
        return f"{self.base(tenant)}:ids:{slot}"

    def stream(self, tenant: str) -> str:
        return f"{self.base(tenant)}:ledger"

    def rate(self, tenant: str) -> str:
        return f"{self.base(tenant)}:rate"

    def holds(self, tenant: str) -> str:
        return f"{self.base(tenant)}:holds"

    def hold_expiry(self, tenant: str) -> str:
        return f"{self.base(tenant)}:hold-expiry"

    def rebuilt(self, tenant: str, epoch: str, ledger: str) -> str:
        return f"{self.base(tenant)}:rebuilt:{epoch}:{ledger}"

    def joined(self, epoch: str) -> str:
        return f"{self.prefix}:acct:joined:{epoch}"
