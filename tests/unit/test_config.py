"""Config validation names the field and what was expected."""

from __future__ import annotations

import pytest

from spillgate.gateway.control.config import DEMO_CONFIG_PATH, ConfigError, load_config, parse_config

MINIMAL = {
    "pools": [{"name": "p", "served_model": "m", "replicas": ["http://127.0.0.1:1"]}],
    "routes": [{"name": "r", "targets": ["p"]}],
    "auth": {"required": False},
}


def test_demo_config_is_valid() -> None:
    config = load_config(DEMO_CONFIG_PATH)
    assert config.pools[0].simulated is not None and config.pools[0].simulated.count == 4
    assert [h.name for h in config.hosted_models] == ["frontier"]


def test_minimal_config() -> None:
    assert parse_config(MINIMAL).routes[0].policy == "least_load"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"pools": [{"name": "p", "served_model": "m"}]}, "pools.0"),
        ({"routes": [{"name": "r", "targets": ["p"], "policy": "magic"}]}, "routes.0.policy"),
        ({"routes": [{"name": "r", "targets": ["nope"]}]}, "unknown target 'nope'"),
        ({"limits": {"max_body_bytes": -1}}, "limits.max_body_bytes"),
        ({"surprise": 1}, "surprise"),
        ({"auth": {"required": True}}, "no tenants"),
        (
            {"tenants": [{"name": "t", "keys": ["sk-test-key"], "isolation": "dedicated"}]},
            "tenants.0: Value error, isolation",
        ),
        (
            {"tenants": [{"name": "t", "keys": ["sk-test-key"], "isolation": "dedicated", "dedicated_pools": ["q"]}]},
            "tenants.0.dedicated_pools.0: unknown pool 'q'",
        ),
        ({"tenants": [{"name": "t", "keys": ["sk-test-key"], "isolation": "private"}]}, "tenants.0.isolation"),
        (
            {"tenants": [{"name": "t", "keys": ["sk-test-key"], "budget": {"usd_per_day": -1}}]},
            "tenants.0.budget.usd_per_day",
        ),
        ({"routes": [{"name": "r", "targets": ["p", "x"]}]}, "routes.0.targets.1: unknown target 'x'"),
    ],
)
def test_errors_name_the_field(change: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({**MINIMAL, **change}, source="cfg.yaml")
    assert "cfg.yaml" in str(info.value)
    assert expected in str(info.value)


def test_not_a_mapping() -> None:
    with pytest.raises(ConfigError, match="mapping"):
        parse_config([1, 2])


def test_every_problem_is_listed_by_path() -> None:
    raw = {**MINIMAL, "limits": {"max_tokens": 0, "max_messages": 0}, "listen": {"port": -1}}
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    paths = sorted(path for path, _ in info.value.problems)
    assert paths == ["limits.max_messages", "limits.max_tokens", "listen.port"]


@pytest.mark.parametrize(
    ("tenants", "expected"),
    [
        ([{"name": "t", "keys": ["sha256:zz"]}], "tenants.0.keys.0"),
        ([{"name": "t", "keys": ["short"]}], "tenants.0.keys.0"),
        ([{"name": "t", "keys": ["os.environ/"]}], "tenants.0.keys.0"),
    ],
)
def test_malformed_keys_are_refused(tenants: list, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({**MINIMAL, "tenants": tenants})
    assert expected in [path for path, _ in info.value.problems]


def test_a_route_only_dedicated_pools_serve_is_refused_for_everyone_else() -> None:
    raw = {
        **MINIMAL,
        "tenants": [
            {"name": "a", "keys": ["sk-tenant-a"], "isolation": "dedicated", "dedicated_pools": ["p"]},
            {"name": "b", "keys": ["sk-tenant-b"]},
        ],
    }
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert info.value.problems == [("routes.0.targets", "every target is a dedicated pool: tenants ['b'] get nothing")]


def test_one_key_cannot_belong_to_two_tenants_or_be_an_admin_key() -> None:
    from spillgate.gateway.control.config import AdminConfig, TenantConfig
    from spillgate.gateway.tenancy.tenants import TenantDirectory

    tenants = [
        TenantConfig(name="a", keys=["sk-shared-key"]),
        TenantConfig(name="b", keys=["sk-other-key", "sk-shared-key"]),
    ]
    with pytest.raises(ConfigError) as info:
        TenantDirectory(tenants, required=True, route_aliases={})
    assert info.value.problems == [("tenants.1.keys.1", "already a key of tenant 'a'")]
    with pytest.raises(ConfigError) as info:
        TenantDirectory(tenants[:1], required=True, route_aliases={}, admin=AdminConfig(keys=["sk-shared-key"]))
    assert info.value.problems == [("admin.keys.0", "an admin key must not also be a tenant key")]


def test_route_weights_are_checked_against_the_policys_scorers() -> None:
    from spillgate.gateway.control.routes import build_routes
    from spillgate.policies.engine import scorer_name

    route = {"name": "r", "targets": ["p"], "policy": "cache_aware", "weights": {"prefix_hit": 0.5}}
    config = parse_config({**MINIMAL, "routes": [route]})
    policy = build_routes(config, {"p": ["p-0"]}, {})["r"].policy
    weights = {scorer_name(w.scorer): w.weight for w in policy.scorers}  # type: ignore[union-attr]
    assert weights["prefix_hit"] == 0.5
    with pytest.raises(ConfigError) as info:
        parse_config({**MINIMAL, "routes": [{**route, "weights": {"telepathy": 1.0}}]})
    path, message = info.value.problems[0]
    assert path == "routes.0.weights" and "telepathy" in message and "prefix_hit" in message


def test_route_affinity_settings_reach_the_cache_aware_guard() -> None:
    from spillgate.gateway.control.routes import build_routes
    from spillgate.policies.plugins import PrefixAffinityScorer

    route = {"name": "r", "targets": ["p"], "policy": "cache_aware", "affinity": {"max_slowdown": 8}}
    config = parse_config({**MINIMAL, "routes": [route]})
    policy = build_routes(config, {"p": ["p-0"]}, {})["r"].policy
    guard = policy.scorers[0].scorer  # type: ignore[union-attr]
    assert guard == PrefixAffinityScorer(max_slowdown=8.0), "unset settings keep the policy's defaults"
    with pytest.raises(ConfigError) as info:
        parse_config({**MINIMAL, "routes": [{**route, "policy": "least_load"}]})
    assert info.value.problems == [("routes.0.affinity", "only cache_aware has an affinity guard, not least_load")]
    with pytest.raises(ConfigError) as info:
        parse_config({**MINIMAL, "routes": [{**route, "affinity": {"max_slowdown": 0.5}}]})
    assert info.value.problems[0][0] == "routes.0.affinity.max_slowdown"


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1",
        "http://127.0.0.1:abc",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:0",
        "http://127.0.0.1:",
        "ftp://127.0.0.1:1",
        "http://:80",
        "http://127.0.0.1:1/v1",
        "http://127.0.0.1:1/?",
        "http://u:p@127.0.0.1:1",
        "http://127.0.0.1:1#x",
    ],
)
@pytest.mark.parametrize("upstream_hosts", [None, ["127.0.0.1"]])
def test_a_replica_url_that_does_not_parse_names_its_field(url: str, upstream_hosts: list[str] | None) -> None:
    raw = {**MINIMAL, "pools": [{"name": "p", "served_model": "m", "replicas": ["http://127.0.0.1:1", url]}]}
    with pytest.raises(ConfigError) as info:
        parse_config(raw | {"secrets": {"upstream_hosts": upstream_hosts}}, source="cfg.yaml")
    assert [path for path, _ in info.value.problems] == ["pools.0.replicas.1"], info.value.problems


@pytest.mark.parametrize("url", ["http://10.0.0.1:30000", "https://[fd00::1]:8443/", "http://llama.internal"])
def test_a_replica_url_with_a_host_and_port_is_taken(url: str) -> None:
    raw = {**MINIMAL, "pools": [{"name": "p", "served_model": "m", "replicas": [url]}]}
    assert [replica.url for replica in parse_config(raw).pools[0].replicas] == [url]
