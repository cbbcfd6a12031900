"""Discovered replicas in the catalog (named by pool and pod, served once, with the pool's settings) and where
the pool's key may go to them (the namespace, selector, scheme and port it was configured with, nothing an edit
moves)."""

from __future__ import annotations

from typing import Any

from spillgate.backends.discovery import DiscoveredReplica
from spillgate.gateway.control.catalog import Endpoints, build_catalog
from spillgate.gateway.control.config import parse_config
from spillgate.gateway.control.egress import SecretBindings

DISCOVERY = {"kubernetes": {"namespace": "llm", "label_selector": "app=sglang", "port": "http"}}


def raw(**pool: Any) -> dict[str, Any]:
    entry = {"name": "llama", "served_model": "m", "api_key": "sk-pool-key-123", "discovery": DISCOVERY} | pool
    return {"pools": [entry], "routes": [{"name": "chat", "targets": ["llama"]}], "auth": {"required": False}}


def test_discovered_replicas_join_their_pool_under_their_pod_names() -> None:
    config = parse_config(raw(replicas=["http://10.0.0.1:30000"]))
    found = {
        "llama": [
            DiscoveredReplica("pod-b", "http://10.0.0.3:30000"),
            DiscoveredReplica("pod-a", "http://10.0.0.2:30000"),
            DiscoveredReplica("pod-dup", "http://10.0.0.1:30000"),  # the static replica's address: served once
        ],
        "other": [DiscoveredReplica("x", "http://10.0.0.9:1")],  # no such pool
    }
    catalog = build_catalog(config, Endpoints({}, {}), {}, found)
    assert [(b.name, b.base_url, b.origin) for b in catalog.backends] == [
        ("llama/10.0.0.1:30000", "http://10.0.0.1:30000", "config"),
        ("llama/pod-a", "http://10.0.0.2:30000", "discovered"),
        ("llama/pod-b", "http://10.0.0.3:30000", "discovered"),
    ]
    assert all(b.api_key == "sk-pool-key-123" and b.served_model == "m" for b in catalog.backends)
    assert catalog.routes["chat"].targets == ("llama/10.0.0.1:30000", "llama/pod-a", "llama/pod-b")
    assert catalog.pool_prices[0].replicas == 3, "discovered replicas pay rent too"
    again = build_catalog(config, Endpoints({}, {}), {b.name: b for b in catalog.backends}, found)
    assert all(a is b for a, b in zip(again.backends, catalog.backends, strict=True)), "kept across versions"


def test_a_pool_without_discovery_takes_none() -> None:
    config = parse_config(raw(discovery=None, replicas=["http://10.0.0.1:30000"]))
    catalog = build_catalog(config, Endpoints({}, {}), {}, {"llama": [DiscoveredReplica("a", "http://10.0.0.2:1")]})
    assert [b.name for b in catalog.backends] == ["llama/10.0.0.1:30000"]


def test_the_pool_key_is_bound_to_the_discovery_it_was_configured_with() -> None:
    bindings = SecretBindings(raw(), ["10.0.0.0/8"], lambda model: None)
    assert bindings.problems(raw()) == []
    assert bindings.problems(raw(discovery=None)) == []
    other_selector = raw(discovery={"kubernetes": DISCOVERY["kubernetes"] | {"label_selector": "app=mine"}})
    other_namespace = raw(discovery={"kubernetes": DISCOVERY["kubernetes"] | {"namespace": "attacker"}})
    cleartext = raw(discovery={"kubernetes": DISCOVERY["kubernetes"] | {"scheme": "http"}})
    assert bindings.problems(cleartext) == [], "http is the default scheme: written or not, the same place"
    tls = raw(discovery={"kubernetes": DISCOVERY["kubernetes"] | {"scheme": "https"}})
    tls_bindings = SecretBindings(tls, ["10.0.0.0/8"], lambda model: None)
    other_scheme = raw(discovery={"kubernetes": DISCOVERY["kubernetes"] | {"scheme": "http"}})
    other_port = raw(discovery={"kubernetes": DISCOVERY["kubernetes"] | {"port": "metrics"}})
    other_number = raw(discovery={"kubernetes": DISCOVERY["kubernetes"] | {"port": 8000}})
    assert [path for path, _ in tls_bindings.problems(other_scheme)] == ["pools.0.api_key"], "https to cleartext"
    for moved in (other_selector, other_namespace, other_port, other_number):
        problems = bindings.problems(moved)
        assert [path for path, _ in problems] == ["pools.0.api_key"], problems
        assert "may not be sent to kubernetes pods" in problems[0][1]
    static = SecretBindings(raw(discovery=None, replicas=["http://10.0.0.1:30000"]), None, lambda model: None)
    problems = static.problems(raw(replicas=["http://10.0.0.1:30000"]))
    assert [path for path, _ in problems] == ["pools.0.api_key"], "a discovery added to a keyed pool is a new place"


def test_a_redacted_pool_key_is_not_put_back_onto_pods_of_another_selector_scheme_or_port() -> None:
    """A key sent through the API comes back redacted in a GET; PUT back with the pool's discovery moved, it must
    be sent again, or an admin key could point it at pods of its choosing."""
    from spillgate.gateway.control.config_history import REDACTED, known_keys, unredact

    discovery = {"kubernetes": {"namespace": "llm", "label_selector": "app=a", "port": 30000, "scheme": "https"}}
    pool = {"name": "p", "served_model": "m", "discovery": discovery, "api_key": "sk-replica"}
    keys = known_keys({"pools": [pool]})
    same, problems = unredact({"pools": [{**pool, "api_key": REDACTED}]}, keys)
    assert problems == [] and same["pools"][0]["api_key"] == "sk-replica"
    for change in ({"label_selector": "app=b"}, {"namespace": "other"}, {"scheme": "http"}, {"port": 8080}):
        moved = {"kubernetes": {**discovery["kubernetes"], **change}}
        out, problems = unredact({"pools": [{**pool, "discovery": moved, "api_key": REDACTED}]}, keys)
        assert [where for where, _ in problems] == ["pools.0.api_key"], change
        assert out["pools"][0]["api_key"] == REDACTED, change
