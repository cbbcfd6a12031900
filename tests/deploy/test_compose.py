"""deploy/compose.yaml, without a Docker daemon: the compose specification's schema, what each service runs
(a real ``spillgate`` invocation), the files it mounts, its ports, and the gateway config it mounts parsed by
the gateway's own parser and pointing at the services that exist."""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from spillgate.backends.sim.presets import PRESETS
from spillgate.gateway.cli import build_parser
from spillgate.gateway.control.config import GatewayConfig, parse_config
from tests.deploy.support import DEPLOY, REPO, dockerfile_stages, env_names

COMPOSE = DEPLOY / "compose.yaml"
CONFIG_IN_IMAGE = "/etc/spillgate/config.yaml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def compose_schema() -> dict[str, Any]:
    """The compose specification's JSON schema as check-jsonschema ships it (its vendored copy, kept current)."""
    schema = resources.files("check_jsonschema") / "builtin_schemas" / "vendor" / "compose-spec.json"
    return json.loads(schema.read_text())


def test_it_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    jsonschema.validate(compose, compose_schema())


def test_the_schema_check_does_refuse_a_broken_file(compose: dict[str, Any]) -> None:
    broken = copy.deepcopy(compose)
    broken["services"]["gateway"]["ports"] = "8080"
    broken["services"]["gateway"]["restart_policy"] = "always"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, compose_schema())


def test_every_service_has_an_image_and_builds_come_from_the_repositorys_dockerfile(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        assert service.get("image") or service.get("build"), f"{name}: neither image nor build"
        image = service.get("image", "")
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image's tag ({image})"
        if "build" in service:
            context = (COMPOSE.parent / service["build"]["context"]).resolve()
            assert context == REPO, f"{name}: builds from {context}"
            assert (context / service["build"].get("dockerfile", "Dockerfile")).is_file()


def bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(host path, container path) of the bind mounts in the short syntax (named volumes left out)."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts.append((source, target))
    return mounts


def test_every_mounted_file_exists_in_the_repository(compose: dict[str, Any]) -> None:
    named = set(compose.get("volumes", {}))
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in named, f"{name}: volume {source} is not declared"
        for source, target in bind_mounts(service):
            path = (COMPOSE.parent / source).resolve()
            assert path.is_relative_to(REPO), f"{name}: {source} lies outside the repository"
            assert path.exists(), f"{name}: {source} does not exist"
            if Path(target).suffix:
                assert path.is_file(), f"{name}: {source} is mounted as the file {target} but is not one"


def test_published_ports_do_not_clash_and_stay_on_localhost(compose: dict[str, Any]) -> None:
    published: dict[int, str] = {}
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            host, host_port, _container = str(port).split(":")
            assert host == "127.0.0.1", f"{name}: {port} is published beyond this machine"
            assert int(host_port) not in published, f"{name} and {published.get(int(host_port))} both take {host_port}"
            published[int(host_port)] = name
    assert published[8080] == "gateway"


def service_args(service: dict[str, Any]) -> Any:
    """The service's command line parsed by spillgate's own parser (the image's entrypoint unless overridden)."""
    entrypoint = service.get("entrypoint") or dockerfile_stages(REPO / "Dockerfile")[-1].last("ENTRYPOINT").exec_form()
    assert entrypoint[0] == "spillgate"
    return build_parser().parse_args([*entrypoint[1:], *service.get("command", [])])


def spillgate_services(compose: dict[str, Any]) -> dict[str, Any]:
    return {name: s for name, s in compose["services"].items() if s.get("image", "").startswith("spillgate:")}


@pytest.fixture(scope="module")
def gateway_config(compose: dict[str, Any]) -> GatewayConfig:
    mounts = dict((t, s) for s, t in bind_mounts(compose["services"]["gateway"]))
    assert CONFIG_IN_IMAGE in mounts, "the gateway's config is mounted where the image's entrypoint reads it"
    path = (COMPOSE.parent / mounts[CONFIG_IN_IMAGE]).resolve()
    return parse_config(yaml.safe_load(path.read_text()), source=str(path))


def test_each_spillgate_service_runs_a_real_command_on_all_interfaces(compose: dict[str, Any]) -> None:
    commands = {name: service_args(s).command for name, s in spillgate_services(compose).items()}
    assert commands["gateway"] == "serve"
    assert sorted(set(commands.values())) == ["serve", "sim-hosted", "sim-replica"]
    for name, service in spillgate_services(compose).items():
        assert service_args(service).host == "0.0.0.0", f"{name} would listen on its loopback only"


def test_the_gateway_config_names_the_services_that_run(compose: dict[str, Any], gateway_config: GatewayConfig) -> None:
    services = spillgate_services(compose)
    sims = {name: service_args(s) for name, s in services.items() if service_args(s).command == "sim-replica"}
    served = set()
    for pool in gateway_config.pools:
        assert pool.replicas, f"pool {pool.name} has no replicas"
        for url in (replica.url for replica in pool.replicas):
            where = urlsplit(url)
            assert where.hostname in sims, f"pool {pool.name}: {url} names no simulated replica service"
            sim = sims[where.hostname]
            assert where.port == sim.port and sim.engine == pool.engine, f"{url}: port or engine differs"
            assert PRESETS[sim.preset].model.hf_name == pool.served_model
            served.add(where.hostname)
    assert served == set(sims), "every replica service is in a pool"
    hosted = {name: service_args(s) for name, s in services.items() if service_args(s).command == "sim-hosted"}
    for model in gateway_config.hosted_models:
        where = urlsplit(model.api_base or "")
        assert where.hostname in hosted and where.port == hosted[where.hostname].port
        assert model.model.split("/", 1)[1] == hosted[where.hostname].model_name


def test_every_secret_the_config_reads_is_in_the_gateways_environment(
    compose: dict[str, Any], gateway_config: GatewayConfig
) -> None:
    environment = compose["services"]["gateway"]["environment"]
    needed = env_names(gateway_config.model_dump())
    assert needed, "the config reads its keys from the environment"
    assert needed <= set(environment), f"not set for the gateway: {sorted(needed - set(environment))}"
    redis = urlsplit(environment["REDIS_URL"])
    assert redis.hostname in compose["services"] and redis.port == 6379


def test_stopping_lets_streams_drain(compose: dict[str, Any], gateway_config: GatewayConfig) -> None:
    grace = compose["services"]["gateway"]["stop_grace_period"]
    assert grace.endswith("s") and float(grace[:-1]) > gateway_config.timeouts.drain_s


def test_healthchecks_ask_the_port_each_service_listens_on(compose: dict[str, Any]) -> None:
    for name, service in spillgate_services(compose).items():
        if "healthcheck" not in service:
            continue
        probe = service["healthcheck"]["test"][-1]
        assert f"http://127.0.0.1:{service_args(service).port}/" in probe, f"{name}: {probe}"


def test_prometheus_scrapes_the_gateway_and_grafana_gets_the_dashboard(compose: dict[str, Any]) -> None:
    services = compose["services"]
    prometheus_mounts = dict((t, s) for s, t in bind_mounts(services["prometheus"]))
    scrape = yaml.safe_load((COMPOSE.parent / prometheus_mounts["/etc/prometheus/prometheus.yml"]).read_text())
    targets = [t for job in scrape["scrape_configs"] for group in job["static_configs"] for t in group["targets"]]
    assert f"gateway:{service_args(services['gateway']).port}" in targets
    grafana_mounts = dict((t, s) for s, t in bind_mounts(services["grafana"]))
    dashboard = [t for t, s in grafana_mounts.items() if s.endswith("config/grafana/spillgate.json")]
    assert len(dashboard) == 1
    provisioning = {t: yaml.safe_load((COMPOSE.parent / s).read_text()) for t, s in grafana_mounts.items()}
    providers = [p for doc in provisioning.values() if isinstance(doc, dict) for p in doc.get("providers", [])]
    assert [p["options"]["path"] for p in providers] == [str(Path(dashboard[0]).parent)]
    sources = [d for doc in provisioning.values() if isinstance(doc, dict) for d in doc.get("datasources", [])]
    assert [(d["type"], d["url"], d["isDefault"]) for d in sources] == [("prometheus", "http://prometheus:9090", True)]
