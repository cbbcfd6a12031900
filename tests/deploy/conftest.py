"""A real gateway for the deploy tests' probe paths: one pool whose only replica never answers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.gateway import gateway_config, start_gateway
from tests.support.procs import RunningProcess, free_port


@pytest.fixture(scope="module")
def deploy_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    config = gateway_config([f"http://127.0.0.1:{free_port()}"])
    proc = start_gateway(config, tmp_path_factory.mktemp("deploy-gateway"))
    yield proc
    proc.stop()
