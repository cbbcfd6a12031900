"""A real Docker daemon for the opt-in live tests: its command line, its containers' state, and the compose
file made runnable from anywhere (paths made absolute, published ports moved off ones that may be in use)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from tests.support.procs import free_port

OPT_IN = "SPILLGATE_DOCKER_TESTS"


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    """One docker command; its output kept for the failure message."""
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def why_not_live() -> str | None:
    """None when the live tests should run: asked for, and a daemon answers."""
    if os.environ.get(OPT_IN) != "1":
        return f"set {OPT_IN}=1 to build and run the image with a Docker daemon"
    if shutil.which("docker") is None:
        return "no docker command"
    if docker("info", timeout=20, check=False).returncode != 0:
        return "no Docker daemon answers"
    return None


def compose_command() -> list[str] | None:
    """Compose v2 (the plugin) where there is one, else the standalone v1, else None."""
    if docker("compose", "version", timeout=20, check=False).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def inspect(container: str) -> dict[str, Any]:
    return json.loads(docker("inspect", container).stdout)[0]


def wait_healthy(container: str, timeout: float) -> None:
    """Until the image's or the service's health check passes; a container without one only has to run."""
    deadline = time.monotonic() + timeout
    while True:
        state = inspect(container)["State"]
        health = state.get("Health", {}).get("Status")
        if (health or ("healthy" if state["Running"] else state["Status"])) == "healthy":
            return
        if not state["Running"] and state["Status"] in ("exited", "dead"):
            logs = docker("logs", "--tail", "40", container, check=False)
            raise AssertionError(f"{container} {state['Status']} ({state['ExitCode']}):\n{logs.stdout}{logs.stderr}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{container} not healthy after {timeout:.0f} s: {health or state['Status']}")
        time.sleep(1)


def image_available(image: str) -> bool:
    """Present, or pulled now; False where no registry is reachable."""
    if docker("image", "inspect", image, check=False).returncode == 0:
        return True
    return docker("pull", image, timeout=600, check=False).returncode == 0


def runnable_compose(path: Path, *, legacy: bool) -> tuple[dict[str, Any], dict[str, int], list[str]]:
    """The compose document with its relative paths made absolute (it goes to compose on standard input),
    every published port moved to a free one (returned by container port), and the services whose image cannot
    be had left out (returned by name). The standalone v1 knows no top-level ``name``: dropped for it."""
    doc = yaml.safe_load(path.read_text())
    if legacy:
        doc.pop("name", None)
    base = path.parent
    missing = [
        name
        for name, service in doc["services"].items()
        if "build" not in service and not image_available(service["image"])
    ]
    ports: dict[int, int] = {}
    for name in missing:
        del doc["services"][name]
    for service in doc["services"].values():
        if "build" in service:
            service["build"]["context"] = str((base / service["build"]["context"]).resolve())
        volumes = []
        for volume in service.get("volumes", []):
            source, _, rest = volume.partition(":")
            if source.startswith("."):
                source = str((base / source).resolve())
            volumes.append(f"{source}:{rest}")
        if volumes:
            service["volumes"] = volumes
        published = []
        for port in service.get("ports", []):
            host, _, container = port.rpartition(":")
            ports[int(container)] = free_port()
            published.append(f"{host.rpartition(':')[0]}:{ports[int(container)]}:{container}")
        if published:
            service["ports"] = published
        depends = service.get("depends_on")
        if isinstance(depends, dict):
            service["depends_on"] = {k: v for k, v in depends.items() if k not in missing}
        elif isinstance(depends, list):
            service["depends_on"] = [k for k in depends if k not in missing]
    return doc, ports, missing


def project_containers(project: str) -> dict[str, dict[str, Any]]:
    """The project's containers by service name, as docker inspect describes them."""
    ids = docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={project}").stdout.split()
    found = [inspect(i) for i in ids]
    return {c["Config"]["Labels"]["com.docker.compose.service"]: c for c in found}
