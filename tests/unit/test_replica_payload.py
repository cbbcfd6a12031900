"""What a client's body becomes on its way to SGLang: the gateway owns routing, salts and queue order."""

from __future__ import annotations

from spillgate.backends.engines import engine_named
from spillgate.gateway.control.config import TenantConfig
from spillgate.gateway.serving.replica import prepare_replica_payload
from spillgate.gateway.tenancy.tenants import Tenant

SGLANG_OWNED = engine_named("sglang").owned_fields


def tenant(isolation: str) -> Tenant:
    config = TenantConfig(
        name="acme", keys=["sk-test-key"], isolation=isolation, dedicated_pools=["p"] * (isolation == "dedicated")
    )
    return Tenant("acme", frozenset({"*"}), isolation=config.isolation)


def test_fields_that_reach_other_hosts_or_jump_the_queue_are_dropped() -> None:
    payload = {
        "model": "chat",
        "messages": [],
        "rid": "someone-elses-request",
        "bootstrap_host": "10.0.0.9",
        "bootstrap_port": 8998,
        "bootstrap_room": 7,
        "lora_path": "/etc/passwd",
        "custom_logit_processor": "gASV...",
        "priority": -100,
        "data_parallel_rank": 3,
        "return_hidden_states": True,
        "temperature": 0.2,
        "sampling_seed": 11,
    }
    prepare_replica_payload(payload, "served/model", tenant("shared"), SGLANG_OWNED)
    assert payload == {"model": "served/model", "messages": [], "temperature": 0.2, "sampling_seed": 11}


def test_cache_salt_is_confined_to_the_tenant() -> None:
    shared = {"cache_salt": "victim|"}
    prepare_replica_payload(shared, "m", tenant("shared"), SGLANG_OWNED)
    assert shared["cache_salt"] == "acme|victim|"
    for isolation in ("salted", "dedicated"):
        for sent in ({}, {"cache_salt": ""}):
            payload = dict(sent)
            prepare_replica_payload(payload, "m", tenant(isolation), SGLANG_OWNED)
            assert payload["cache_salt"] == "acme|"
        split = {"cache_salt": "mine"}  # a client may split its tenant's cache further, never leave it
        prepare_replica_payload(split, "m", tenant(isolation), SGLANG_OWNED)
        assert split["cache_salt"] == "acme|mine"
    unsalted: dict[str, object] = {"cache_salt": ""}
    prepare_replica_payload(unsalted, "m", tenant("shared"), SGLANG_OWNED)
    assert "cache_salt" not in unsalted
