"""Rendering the Kustomize trees under deploy/: with ``kubectl kustomize`` where kubectl is installed, else by
reading each kustomization's resources, components and ConfigMap generators here (no patches, no name hashes),
so the manifests are checked either way."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

KUBECTL = shutil.which("kubectl")


def render(directory: Path) -> list[dict[str, Any]]:
    """Every object the kustomization in ``directory`` produces."""
    if KUBECTL:
        result = subprocess.run(
            [KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=False
        )
        assert result.returncode == 0, result.stderr
        return [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return _read(directory)


def overlay(where: Path, base: Path, components: list[Path]) -> Path:
    """A kustomization in ``where`` of ``base`` with ``components`` (paths relative, as kustomize needs them)."""
    where.mkdir(parents=True, exist_ok=True)
    document = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(base, where)],
        "components": [os.path.relpath(c, where) for c in components],
    }
    (where / "kustomization.yaml").write_text(yaml.safe_dump(document))
    return where


def _read(directory: Path) -> list[dict[str, Any]]:
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    objects: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        objects += _read(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text()) if d]
    for generator in spec.get("configMapGenerator", []):
        data = {}
        for item in generator.get("files", []):
            key, _, source = item.rpartition("=")
            data[key or Path(source).name] = (directory / source).read_text()
        made = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data}
        objects = [o for o in objects if not (o["kind"] == "ConfigMap" and o["metadata"]["name"] == generator["name"])]
        objects.append(made)
    for component in spec.get("components", []):
        objects = _merge(objects, _read((directory / component).resolve()))
    if "namespace" in spec:
        for obj in objects:
            if obj["kind"] != "Namespace":
                obj["metadata"]["namespace"] = spec["namespace"]
            for subject in obj.get("subjects", []):  # as kustomize does for a RoleBinding's service accounts
                if subject.get("kind") == "ServiceAccount":
                    subject["namespace"] = spec["namespace"]
    return objects


def _merge(objects: list[dict[str, Any]], more: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = {(o["kind"], o["metadata"]["name"]) for o in more}
    return [o for o in objects if (o["kind"], o["metadata"]["name"]) not in names] + more
