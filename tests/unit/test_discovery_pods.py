"""Which pods are replicas (the pure decision), the set a list and its watch events build, and label selectors."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from lightkube.core import decoders
from lightkube.resources.core_v1 import Pod

from spillgate.backends.discovery import DiscoveredReplica
from spillgate.backends.discovery.pods import PodPort, PodSet, SelectorError, parse_selector, replica_of

HTTP = PodPort(30000)


def pod(
    name: str = "llama-0",
    *,
    ip: str | None = "10.1.2.3",
    phase: str = "Running",
    ready: bool = True,
    deleting: bool = False,
    port_name: str = "http",
) -> Any:
    """A Pod as the API server sends it, decoded by lightkube as the watcher receives it."""
    metadata: dict[str, Any] = {"name": name, "namespace": "llm", "resourceVersion": "7"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {"phase": phase, "conditions": [{"type": "Ready", "status": str(ready)}]}
    if ip is not None:
        status["podIP"] = ip
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "engine", "ports": [{"name": port_name, "containerPort": 30000}]}]},
        "status": status,
    }
    return decoders.decode_object(json.dumps(body).encode(), Pod)


def test_a_running_ready_pod_with_an_ip_is_a_replica() -> None:
    assert replica_of(pod(), HTTP) == (DiscoveredReplica("llama-0", "http://10.1.2.3:30000"), "ready")
    https = PodPort("http", "https")
    assert replica_of(pod(), https)[0] == DiscoveredReplica("llama-0", "https://10.1.2.3:30000")
    assert replica_of(pod(ip="fd00::5"), HTTP)[0] == DiscoveredReplica("llama-0", "http://[fd00::5]:30000")


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"ready": False}, "not ready"),
        ({"phase": "Pending"}, "phase Pending"),
        ({"phase": "Succeeded"}, "phase Succeeded"),
        ({"ip": None}, "no IP yet"),
        ({"deleting": True}, "terminating"),
    ],
)
def test_a_pod_that_cannot_serve_is_not_a_replica(changes: dict[str, Any], why: str) -> None:
    assert replica_of(pod(**changes), HTTP) == (None, why)


@pytest.mark.parametrize(
    ("ip", "what"),
    [
        ("10.1.2", "not an IP address"),
        ("10.1.2.3:80", "not an IP address"),
        ("evil.example", "not an IP address"),
        ("127.0.0.1", "loopback"),
        ("127.9.9.9", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("fe80::1%eth0", "a scoped address"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
    ],
)
def test_a_pod_whose_ip_no_other_host_could_reach_is_not_a_replica(ip: str, what: str) -> None:
    assert replica_of(pod(ip=ip), HTTP) == (None, f"unusable IP {ip!r}: {what}")


def test_a_loopback_pod_serves_only_when_asked() -> None:
    assert replica_of(pod(ip="127.0.0.1"), HTTP, loopback=True)[0] == DiscoveredReplica(
        "llama-0", "http://127.0.0.1:30000"
    )
    assert replica_of(pod(ip="169.254.169.254"), HTTP, loopback=True)[0] is None, "link-local still refused"


def test_a_pod_with_an_unusable_ip_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    pods = PodSet(HTTP)
    with caplog.at_level(logging.WARNING, logger="spillgate.discovery"):
        assert not pods.relisted([pod("a", ip="169.254.169.254")])
        assert not pods.event("MODIFIED", pod("a", ip="169.254.169.254"))
        assert not pods.event("MODIFIED", pod("a", ip="169.254.169.254"))
        assert not pods.relisted([pod("a", ip="169.254.169.254")])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["discovery: pod llm/a is not served: unusable IP '169.254.169.254': link-local"]
    assert pods.replicas() == () and pods.why == {"a": "unusable IP '169.254.169.254': link-local"}
    assert pods.event("MODIFIED", pod("a", ip="10.0.0.1")), "a usable IP later: it serves"


def test_a_named_port_is_looked_up_in_the_containers() -> None:
    assert replica_of(pod(port_name="http"), PodPort("http"))[0] is not None
    assert replica_of(pod(port_name="metrics"), PodPort("http")) == (None, "no container port named 'http'")


def test_the_set_follows_events_and_a_relist_drops_what_it_lacks() -> None:
    pods = PodSet(HTTP)
    assert pods.relisted([pod("a"), pod("b", ready=False)])
    assert [r.pod for r in pods.replicas()] == ["a"]
    assert pods.why == {"b": "not ready"}
    assert pods.event("MODIFIED", pod("b"))
    assert [r.pod for r in pods.replicas()] == ["a", "b"]
    assert not pods.event("MODIFIED", pod("b")), "the same state again is no change"
    assert not pods.event("BOOKMARK", pod("b")), "a bookmark carries no pod"
    assert pods.event("MODIFIED", pod("a", deleting=True))
    assert [r.pod for r in pods.replicas()] == ["b"]
    assert pods.event("DELETED", pod("a", deleting=True)) is False, "already out of the set"
    assert "a" not in pods.pods
    assert pods.relisted([pod("c")]), "b vanished from the list: gone, whatever events were lost"
    assert [r.pod for r in pods.replicas()] == ["c"]


def test_a_relist_that_fails_midway_leaves_the_set_as_it_was() -> None:
    pods = PodSet(HTTP)
    pods.relisted([pod("a"), pod("b", ready=False)])
    broken = pod("y")
    broken.status.conditions = [object()]  # a condition without a type: reading it raises
    with pytest.raises(AttributeError):
        pods.relisted([pod("x"), broken, pod("z")])
    assert [r.pod for r in pods.replicas()] == ["a"]
    assert set(pods.pods) == {"a", "b"} and pods.why == {"b": "not ready"}


def test_a_pod_whose_ip_changed_is_a_new_address() -> None:
    pods = PodSet(HTTP)
    pods.relisted([pod("a", ip="10.0.0.1")])
    assert pods.event("MODIFIED", pod("a", ip="10.0.0.2"))
    assert pods.replicas() == (DiscoveredReplica("a", "http://10.0.0.2:30000"),)


def test_label_selectors_encode_as_the_api_server_reads_them() -> None:
    from lightkube.core.selector import build_selector

    text = "app=sglang,tier!=canary,env in (prod,staging),gpu,!legacy"
    assert build_selector(parse_selector(text)) == text
    assert build_selector(parse_selector("app==x")) == "app=x"


@pytest.mark.parametrize("text", ["", "app=x,", "a b=c", "env in prod", "env in ()", "=x"])
def test_a_malformed_selector_is_refused(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_selector(text)
