"""Replica names: derived from what identifies a replica (its address, a name the config gives it, its pod, its
place among the simulated), never from its place in the pool, so one leaving renames no other and every process
derives the same names from the same config, however it came to run it."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import pytest

from spillgate.backends.backend import Backend
from spillgate.backends.discovery import DiscoveredReplica
from spillgate.gateway.control.catalog import Endpoints, build_catalog
from spillgate.gateway.control.config import ConfigError, parse_config
from spillgate.gateway.control.config_history import destination
from spillgate.gateway.control.egress import SecretBindings, upstream_urls
from spillgate.gateway.control.replica_edits import ReplicaEditRefused, add_replica, remove_replica
from spillgate.gateway.control.replica_names import configured_name
from spillgate.gateway.serving.relay import conceal
from spillgate.gateway.state import build_state

A, B, C = "http://10.0.0.1:30000", "http://10.0.0.2:30000", "http://10.0.0.3:30000"


def raw(*replicas: object, **pool: Any) -> dict[str, Any]:
    entry = {"name": "gpu", "served_model": "m", "replicas": list(replicas)} | pool
    return {"pools": [entry], "routes": [{"name": "chat", "targets": ["gpu"]}], "auth": {"required": False}}


def names(config: dict[str, Any], existing: dict[str, Any] | None = None, **simulated: list[str]) -> list[str]:
    catalog = build_catalog(parse_config(config), Endpoints(simulated, {}), existing or {})
    return [b.name for b in catalog.backends]


def problems(config: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as refused:
        parse_config(config)
    return refused.value.problems


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("http://10.0.0.1:30000", "gpu/10.0.0.1:30000"),
        ("http://10.0.0.1:30000/", "gpu/10.0.0.1:30000"),
        ("http://Replica-0.LLM.svc.:8000", "gpu/replica-0.llm.svc:8000"),
        ("http://llama.internal", "gpu/llama.internal:80"),
        ("https://llama.internal", "gpu/llama.internal:443"),
        ("https://[FD00::1]:8443", "gpu/[fd00::1]:8443"),
        ("http://bücher.example:8000", "gpu/xn--bcher-kva.example:8000"),
    ],
)
def test_a_configured_replica_is_named_by_its_pool_and_address(url: str, name: str) -> None:
    assert names(raw(url)) == [name]
    assert name.isascii(), "a response header carries it"


def test_a_replica_the_config_names_goes_by_that_name() -> None:
    config = raw({"url": A, "name": "a100-1"}, {"url": B}, C)
    assert names(config) == ["gpu/a100-1", "gpu/10.0.0.2:30000", "gpu/10.0.0.3:30000"]
    dumped = parse_config(config).model_dump()["pools"][0]["replicas"]
    assert dumped == [{"url": A, "name": "a100-1"}, B, C], "as written, but for an unnamed {url}"


def test_removing_the_first_of_three_keeps_the_others_names_and_what_was_learned_of_them() -> None:
    before = build_catalog(parse_config(raw(A, B, C)), Endpoints({}, {}), {})
    second, third = before.backends[1], before.backends[2]
    second.ttft_s, third.tpot_s = 0.123, 0.0456  # measured latency estimates
    after = build_catalog(parse_config(raw(B, C)), Endpoints({}, {}), {b.name: b for b in before.backends})
    assert [b.name for b in after.backends] == ["gpu/10.0.0.2:30000", "gpu/10.0.0.3:30000"]
    assert after.backends[0] is second and after.backends[1] is third, "the same backends, state and all"
    assert (second.ttft_s, third.tpot_s) == (0.123, 0.0456)
    assert after.backends[0].prefill is before.backends[0].prefill, "the pool's learned prefill rate too"
    assert after.routes["chat"].targets == ("gpu/10.0.0.2:30000", "gpu/10.0.0.3:30000")


def test_a_fresh_process_on_the_latest_config_names_replicas_as_one_that_applied_every_edit() -> None:
    edits = [raw(A, B, C), raw(B, C), raw(B, C, A), raw(C, A, {"url": B, "name": "b"})]
    existing: dict[str, Any] = {}
    for config in edits:
        applied = build_catalog(parse_config(config), Endpoints({}, {}), existing)
        existing = {b.name: b for b in applied.backends}
    assert list(existing) == names(edits[-1]) == ["gpu/10.0.0.3:30000", "gpu/10.0.0.1:30000", "gpu/b"]


def test_the_prefix_index_of_the_replicas_that_stay_survives_an_edit(tmp_path: Path) -> None:
    config = raw(A, B, C) | {"state": {"data_dir": str(tmp_path)}}
    state = build_state(parse_config(config), {}, {})
    second = configured_name("gpu", B)
    state.prefix.index.insert(second, [11, 12, 13])
    state.prefix.index.insert(configured_name("gpu", A), [21, 22])
    state.apply(state.catalog_for(parse_config(raw(B, C) | {"state": config["state"]})))
    assert state.prefix.index.match([11, 12, 13], [second]) == {second: 3}, "what the second replica holds"
    assert not state.prefix.index.knows(configured_name("gpu", A)), "the removed replica is forgotten"


def test_simulated_replicas_are_numbered_among_themselves() -> None:
    sims = ["http://127.0.0.1:41001", "http://127.0.0.1:41002"]
    config = raw(A, B, simulated={"count": 2})
    assert names(config, gpu=sims) == ["gpu/10.0.0.1:30000", "gpu/10.0.0.2:30000", "gpu-0", "gpu-1"]
    assert names(raw(B, simulated={"count": 2}), gpu=sims)[1:] == ["gpu-0", "gpu-1"], "a static one left: same"
    assert names(raw(simulated={"count": 2}), gpu=list(reversed(sims))) == ["gpu-0", "gpu-1"], "whatever the ports"


def test_a_replica_listed_twice_is_refused_by_its_field() -> None:
    assert problems(raw(A, B, "http://10.0.0.1:30000/")) == [
        ("pools.0.replicas.2", "http://10.0.0.1:30000/ has the address of pools.0.replicas.0: list a replica once")
    ]
    assert [path for path, _ in problems(raw("http://h", "http://H:80"))] == ["pools.0.replicas.1"]
    assert [path for path, _ in problems(raw(A, {"url": A, "name": "again"}))] == ["pools.0.replicas.1"]


def test_two_replicas_of_a_pool_may_not_share_a_name() -> None:
    [(path, message)] = problems(raw({"url": A, "name": "x"}, {"url": B, "name": "x"}))
    assert path == "pools.0.replicas.1.name" and "'gpu/x' is taken by pools.0.replicas.0.name" in message


@pytest.mark.parametrize("name", ["", "a/b", "host:8000", "-lead", "x" * 64, "spa ce", "ü"])
def test_a_replica_name_that_could_pass_for_another_kind_is_refused(name: str) -> None:
    [(path, message)] = problems(raw({"url": A, "name": name}))
    assert path == "pools.0.replicas.0.name" and "is not a replica name" in message


def test_a_replica_entry_is_a_url_or_a_url_and_a_name() -> None:
    assert problems(raw(5)) == [
        (
            "pools.0.replicas.0",
            "Value error, a replica is its URL (http://host:port) or {url: http://host:port, name: NAME}",
        )
    ]
    assert [path for path, _ in problems(raw({"url": A, "weight": 2}))] == ["pools.0.replicas.0.weight"]
    assert [path for path, _ in problems(raw({"name": "a"}))] == ["pools.0.replicas.0.url"]
    assert [path for path, _ in problems(raw("ftp://10.0.0.1:1"))] == ["pools.0.replicas.0"], "where it was written"
    assert [path for path, _ in problems(raw({"url": "ftp://10.0.0.1:1"}))] == ["pools.0.replicas.0.url"]


def test_a_hosted_model_may_not_take_a_replicas_name() -> None:
    config = raw(simulated={"count": 1})
    config["hosted_models"] = [{"name": "gpu-0", "model": "openai/gpt-4o", "input_per_mtok": 1, "output_per_mtok": 1}]
    [(path, message)] = problems(config)
    assert path == "hosted_models.0.name" and "'gpu-0' is taken by pools.0.simulated" in message


def test_a_pod_named_as_a_configured_replica_is_not_served_under_its_name(caplog: pytest.LogCaptureFixture) -> None:
    discovery = {"kubernetes": {"namespace": "llm", "label_selector": "app=sglang", "port": "http"}}
    config = parse_config(raw({"url": A, "name": "pod-a"}, discovery=discovery))
    found = {"gpu": [DiscoveredReplica("pod-a", B), DiscoveredReplica("pod-b", C)]}
    with caplog.at_level(logging.WARNING, logger="spillgate.discovery"):
        catalog = build_catalog(config, Endpoints({}, {}), {}, found)
    assert [(b.name, b.base_url) for b in catalog.backends] == [("gpu/pod-a", A), ("gpu/pod-b", C)]
    assert "discovered pod-a at http://10.0.0.2:30000 is not served" in caplog.text


def test_the_url_of_a_named_replica_is_held_to_the_upstream_hosts() -> None:
    config = raw("http://10.0.0.1:1", {"url": "http://203.0.113.9:1", "name": "far"})
    assert list(upstream_urls(config)) == [
        ("pools.0.replicas.0", "http://10.0.0.1:1"),
        ("pools.0.replicas.1.url", "http://203.0.113.9:1"),
    ]
    refused = problems(config | {"secrets": {"upstream_hosts": ["10.0.0.0/8"]}})
    assert [path for path, _ in refused] == ["pools.0.replicas.1.url"]


def test_naming_a_replica_moves_no_key() -> None:
    keyed = raw(A, api_key="sk-replica-key-1")
    named = raw({"url": A, "name": "a"}, api_key="sk-replica-key-1")
    assert SecretBindings(keyed, None, lambda model: None).problems(named) == []
    before, after = destination("pools", keyed["pools"][0]), destination("pools", named["pools"][0])
    assert before.admits(after), "a redacted key is put back onto the same replica, named or not"
    elsewhere = raw({"url": B, "name": "a"}, api_key="sk-replica-key-1")
    assert [path for path, _ in SecretBindings(keyed, None, lambda model: None).problems(elsewhere)] == [
        "pools.0.api_key"
    ]


def test_the_replica_edits_read_and_keep_both_forms() -> None:
    config = raw({"url": A, "name": "a"}, B)
    with pytest.raises(ReplicaEditRefused) as exists:
        add_replica("gpu", A + "/", {}, [])(copy.deepcopy(config))
    assert exists.value.code == "replica_exists"
    added = add_replica("gpu", C, {}, [], name="c")(copy.deepcopy(config))
    assert added["pools"][0]["replicas"] == [{"url": A, "name": "a"}, B, {"url": C, "name": "c"}]
    removed = remove_replica("gpu", {}, url=B)(copy.deepcopy(added))
    assert removed["pools"][0]["replicas"] == [{"url": A, "name": "a"}, {"url": C, "name": "c"}]
    assert names(removed) == ["gpu/a", "gpu/c"]
    removed = remove_replica("gpu", {}, url=A)(removed)
    assert removed["pools"][0]["replicas"] == [{"url": C, "name": "c"}]
    with pytest.raises(ReplicaEditRefused) as missing:
        remove_replica("gpu", {}, url=A)(removed)
    assert missing.value.code == "replica_not_found" and "'http://10.0.0.3:30000'" in missing.value.message


def test_a_replica_is_removed_by_the_name_the_admin_api_lists() -> None:
    config = raw({"url": A, "name": "a"}, B, C)
    assert names(remove_replica("gpu", {}, name="gpu/a")(copy.deepcopy(config))) == [
        "gpu/10.0.0.2:30000",
        "gpu/10.0.0.3:30000",
    ]
    assert names(remove_replica("gpu", {}, name="a")(copy.deepcopy(config)))[0] == "gpu/10.0.0.2:30000"
    assert names(remove_replica("gpu", {}, name="gpu/10.0.0.2:30000")(copy.deepcopy(config))) == [
        "gpu/a",
        "gpu/10.0.0.3:30000",
    ]
    with pytest.raises(ReplicaEditRefused) as by_address:
        remove_replica("gpu", {}, name="gpu/10.0.0.1:30000")(copy.deepcopy(config))
    assert by_address.value.code == "replica_not_found", "a named replica goes by its name, not its address"
    assert by_address.value.param == "name" and "'gpu/a'" in by_address.value.message
    with pytest.raises(ReplicaEditRefused) as discovered:
        remove_replica("gpu", {"gpu": {"http://10.0.0.9:30000": "pod-9"}}, name="gpu/pod-9")(copy.deepcopy(config))
    assert discovered.value.code == "replica_discovered" and "pod 'pod-9'" in discovered.value.message


def test_an_engine_repeating_a_replicas_name_or_address_tells_the_client_neither() -> None:
    backend = Backend(configured_name("gpu", A), "replica", A, "m")
    said = "replica gpu/10.0.0.1:30000 at http://10.0.0.1:30000 (10.0.0.1:30000 on 10.0.0.1) failed"
    assert conceal(said, backend) == "replica the backend at the backend (the backend on the backend) failed"
