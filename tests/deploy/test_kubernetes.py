"""deploy/kubernetes, without an API server: rendered by kustomize, every object validated against Kubernetes'
own schemas (the CRDs' required fields checked here), the gateway config in the ConfigMap parsed by the
gateway's parser, and the Deployment's probes, drain, security and secrets checked against what the gateway
and its image do."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from spillgate.gateway.cli import build_parser
from spillgate.gateway.control.config import ConfigError, GatewayConfig, PoolConfig, parse_config
from tests.deploy.kustomize import overlay, render
from tests.deploy.support import DEPLOY, REPO, dockerfile_stages, env_names
from tests.support.procs import RunningProcess

BASE = DEPLOY / "kubernetes"
COMPONENTS = BASE / "components"
EXAMPLE = DEPLOY / "overlays" / "example"
VERSIONS = ("1.30.0", latest_version())
"""The oldest Kubernetes still widely run that has every field used here, and the newest the validator knows."""
CRDS = {"monitoring.coreos.com/v1/ServiceMonitor", "keda.sh/v1alpha1/ScaledObject"}


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return render(BASE)


@pytest.fixture(scope="module")
def example() -> list[dict[str, Any]]:
    return render(EXAMPLE)


@pytest.fixture(scope="module")
def with_hpa(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    where = tmp_path_factory.mktemp("hpa-overlay")
    return render(overlay(where, BASE, [COMPONENTS / "hpa", COMPONENTS / "sglang-replicas"]))


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def gateway_deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objects, "Deployment", "spillgate")


def gateway_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = gateway_deployment(objects)["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "gateway")


def raw_config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The gateway's config as the ConfigMap its Deployment mounts holds it."""
    volumes = gateway_deployment(objects)["spec"]["template"]["spec"]["volumes"]
    name = next(v["configMap"]["name"] for v in volumes if "configMap" in v)
    return yaml.safe_load(one(objects, "ConfigMap", name)["data"]["config.yaml"])


def parsed(raw: dict[str, Any]) -> GatewayConfig:
    """``raw`` through the gateway's parser. Until the schema knows ``pools[].discovery`` (being added), a
    config whose only problems are that field is skipped, not passed."""
    try:
        return parse_config(raw, source="ConfigMap spillgate-config")
    except ConfigError as exc:
        if "discovery" not in PoolConfig.model_fields and all(
            re.fullmatch(r"pools\.\d+\.discovery", path) for path, _ in exc.problems
        ):
            pytest.skip("the config schema has no pools[].discovery yet; the ConfigMap's config uses it")
        raise


def test_the_base_renders_the_gateway_and_what_it_needs(base: list[dict[str, Any]]) -> None:
    kinds = {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service"}
    assert sorted(o["kind"] for o in base) == sorted({*kinds, "PodDisruptionBudget"})
    assert {o["metadata"].get("namespace") for o in base if o["kind"] != "Namespace"} == {"llm"}


def crd_problems(obj: dict[str, Any]) -> list[str]:
    """The fields the ServiceMonitor and ScaledObject CRDs require, and the shapes their operators read."""
    problems = []
    spec = obj.get("spec", {})
    if not obj.get("metadata", {}).get("name"):
        problems.append("metadata.name")
    if obj["kind"] == "ServiceMonitor":
        if not spec.get("selector"):
            problems.append("spec.selector")
        for i, endpoint in enumerate(spec.get("endpoints") or [None]):
            if not isinstance(endpoint, dict) or not (endpoint.get("port") or endpoint.get("targetPort")):
                problems.append(f"spec.endpoints.{i}.port")
    if obj["kind"] == "ScaledObject":
        target = spec.get("scaleTargetRef", {})
        if not target.get("name"):
            problems.append("spec.scaleTargetRef.name")
        if not spec.get("triggers"):
            problems.append("spec.triggers")
        for i, trigger in enumerate(spec.get("triggers", [])):
            if trigger.get("type") == "prometheus":
                for key in ("serverAddress", "query", "threshold"):
                    if not isinstance(trigger.get("metadata", {}).get(key), str):
                        problems.append(f"spec.triggers.{i}.metadata.{key} (a string)")
        if not 0 < spec.get("minReplicaCount", 0) <= spec.get("maxReplicaCount", 100):
            problems.append("spec.minReplicaCount: at least 1, at most maxReplicaCount")
    return problems


def validate(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        kind = f"{obj['apiVersion']}/{obj['kind']}"
        if kind in CRDS:
            assert crd_problems(obj) == [], f"{kind} {obj['metadata'].get('name')}"
            continue
        for version in VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def test_every_object_is_valid(
    base: list[dict[str, Any]], example: list[dict[str, Any]], with_hpa: list[dict[str, Any]]
) -> None:
    for objects in (base, example, with_hpa):
        validate(objects)
    assert {f"{o['apiVersion']}/{o['kind']}" for o in example} >= CRDS


def test_the_validators_do_refuse_broken_objects(base: list[dict[str, Any]], example: list[dict[str, Any]]) -> None:
    broken = copy.deepcopy(gateway_deployment(base))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pth"] = "/ready"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)
    scaled = copy.deepcopy(one(example, "ScaledObject"))
    del scaled["spec"]["triggers"][0]["metadata"]["query"]
    assert crd_problems(scaled) == ["spec.triggers.0.metadata.query (a string)"]


def test_the_configmaps_config_parses(base: list[dict[str, Any]]) -> None:
    config = parsed(raw_config(base))
    assert config.pools and config.state.data_dir


def test_the_discovery_config_has_the_agreed_shape_and_finds_the_example_replicas(
    example: list[dict[str, Any]],
) -> None:
    pool = raw_config(example)["pools"][0]
    discovery = pool["discovery"]["kubernetes"]
    assert set(discovery) == {"namespace", "label_selector", "port"}
    assert discovery["namespace"] == gateway_deployment(example)["metadata"]["namespace"]
    key, _, value = discovery["label_selector"].partition("=")
    replicas = one(example, "Deployment", "sglang-llama-8b")
    assert replicas["spec"]["template"]["metadata"]["labels"][key] == value
    ports = [p["containerPort"] for c in replicas["spec"]["template"]["spec"]["containers"] for p in c["ports"]]
    assert discovery["port"] in ports


def test_the_container_runs_the_images_entrypoint_with_real_flags(base: list[dict[str, Any]]) -> None:
    container = gateway_container(base)
    entrypoint = dockerfile_stages(REPO / "Dockerfile")[-1].last("ENTRYPOINT").exec_form()
    args = build_parser().parse_args([*(container.get("command") or entrypoint)[1:], *container["args"]])
    assert args.command == "serve" and args.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == args.port
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert str(Path(args.config).parent) in mounts and Path(args.config).name == "config.yaml"


def probe_path(container: dict[str, Any], probe: str) -> str:
    action = container[probe]["httpGet"]
    assert action["port"] in ("http", 8080)
    return action["path"]


def test_probes_point_at_paths_the_gateway_serves(base: list[dict[str, Any]], deploy_gateway: RunningProcess) -> None:
    container = gateway_container(base)
    assert probe_path(container, "readinessProbe") == "/ready"
    assert probe_path(container, "livenessProbe") == probe_path(container, "startupProbe") == "/health"
    assert httpx.get(deploy_gateway.url + probe_path(container, "livenessProbe")).status_code == 200
    # No replica of this gateway answers: /ready says so (503) rather than not existing (404).
    assert httpx.get(deploy_gateway.url + probe_path(container, "readinessProbe")).status_code == 503


def test_termination_outlasts_the_prestop_sleep_and_the_drain(base: list[dict[str, Any]]) -> None:
    drain_s = raw_config(base).get("timeouts", {}).get("drain_s", 30.0)
    pod = gateway_deployment(base)["spec"]["template"]["spec"]
    sleep = gateway_container(base)["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep" and 0 < float(sleep[1]) <= 15
    assert pod["terminationGracePeriodSeconds"] > drain_s + float(sleep[1])


def test_the_pod_runs_as_the_images_user_on_a_read_only_root(base: list[dict[str, Any]]) -> None:
    pod = gateway_deployment(base)["spec"]["template"]["spec"]
    container = gateway_container(base)
    image_user = dockerfile_stages(REPO / "Dockerfile")[-1].last("USER").args.split(":")[0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == int(image_user)
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] and not context["allowPrivilegeEscalation"]
    assert context["capabilities"]["drop"] == ["ALL"]
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert {raw_config(base)["state"]["data_dir"], "/tmp"} <= writable
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_every_secret_the_config_reads_comes_from_the_keys_secret(base: list[dict[str, Any]]) -> None:
    env = {e["name"]: e for e in gateway_container(base)["env"]}
    needed = env_names(raw_config(base))
    assert {"TEAM_A_KEY", "SPILLGATE_ADMIN_KEY", "SPILLGATE_METRICS_TOKEN", "OPENAI_API_KEY"} <= needed
    example_secret = yaml.safe_load((BASE / "secret.example.yaml").read_text())
    for name in needed:
        reference = env[name]["valueFrom"]["secretKeyRef"]
        assert reference["name"] == example_secret["metadata"]["name"]
        assert reference["key"] in example_secret["stringData"], f"{name}: {reference['key']} not in the example"
    assert not any(o["kind"] == "Secret" for o in base), "keys are never committed: the Secret is made by hand"


def test_the_service_account_may_watch_pods_in_its_namespace_and_nothing_more(base: list[dict[str, Any]]) -> None:
    account = gateway_deployment(base)["spec"]["template"]["spec"]["serviceAccountName"]
    binding = one(base, "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "llm"}]
    role = one(base, "Role", binding["roleRef"]["name"])
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]


def test_the_service_and_servicemonitor_reach_the_gateways_metrics(example: list[dict[str, Any]]) -> None:
    service = one(example, "Service", "spillgate")
    pod_labels = gateway_deployment(example)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    monitor = one(example, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]} and endpoint["path"] == "/metrics"
    token = env_of(example)["SPILLGATE_METRICS_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert endpoint["authorization"]["credentials"] == {"name": token["name"], "key": token["key"]}
    assert raw_config(example)["metrics"]["token"] == "os.environ/SPILLGATE_METRICS_TOKEN"


def env_of(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in gateway_container(objects)["env"]}


def test_the_autoscalers_scale_the_replicas_on_the_gateways_advice(
    example: list[dict[str, Any]], with_hpa: list[dict[str, Any]], deploy_gateway: RunningProcess
) -> None:
    pools = {p["name"] for p in raw_config(example)["pools"]}
    scaled = one(example, "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == one(example, "Deployment", "sglang-llama-8b")["metadata"]["name"]
    [trigger] = scaled["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    match = re.search(r'spillgate_recommended_replicas\{.*pool="([^"]+)".*\}', query)
    assert match and match.group(1) in pools and trigger["metadata"]["threshold"] == "1"
    hpa = one(with_hpa, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "sglang-llama-8b"
    [metric] = hpa["spec"]["metrics"]
    assert metric["external"]["metric"]["name"] == "spillgate_recommended_replicas"
    assert metric["external"]["metric"]["selector"]["matchLabels"]["pool"] in pools
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    # The gauge both read exists, labelled by pool, on a running gateway.
    assert 'spillgate_recommended_replicas{pool="pool"}' in httpx.get(deploy_gateway.url + "/metrics").text


def test_the_redis_component_changes_only_the_redis_url_and_points_at_its_redis(
    example: list[dict[str, Any]], base: list[dict[str, Any]]
) -> None:
    with_redis, alone = raw_config(example), raw_config(base)
    assert with_redis["state"].pop("redis_url") == "os.environ/REDIS_URL"
    assert with_redis == alone, "components/redis/gateway.yaml has drifted from gateway.yaml"
    if "REDIS_URL" not in env_of(example):
        pytest.skip("rendered without kubectl: the component's env patch is kustomize's to apply")
    url = env_of(example)["REDIS_URL"]["value"]
    service = one(example, "Service", "spillgate-redis")
    assert url == f"redis://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/0"


def test_the_config_in_the_redis_component_parses(example: list[dict[str, Any]]) -> None:
    assert parsed(raw_config(example)).state.redis_url == "os.environ/REDIS_URL"
