"""Tenants: their keys (kept as digests), their rules, and the spend they may read."""
