"""Fuzz every operation in the gateway's OpenAPI schema against a running gateway: no input gets a 500,
and every refusal is an OpenAI-format error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.support.gateway import TENANT_KEY, gateway_config, start_gateway, start_replica
from tests.support.procs import RunningProcess

ADMIN_KEY = "sk-fuzz-admin"


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    log_dir: Path = tmp_path_factory.mktemp("fuzz")
    replica = start_replica(log_dir, "--time-scale", "0.01")
    config = gateway_config([replica.url], admin={"keys": [ADMIN_KEY]})
    gateway = start_gateway(config, log_dir)
    yield gateway
    gateway.stop()
    replica.stop()


def test_no_input_gets_a_server_error(fuzzed: RunningProcess) -> None:
    schema = schemathesis.openapi.from_url(fuzzed.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8
    for operation in operations:
        check_operation(operation, fuzzed)


def check_operation(operation: Any, fuzzed: RunningProcess) -> None:
    # As a tenant, as an admin and with a key nobody has. Live edits are fuzzed as a tenant only (refused
    # by the key check); tests/gateway/test_live_config.py covers what an admin's edit does.
    editing = operation.path.startswith("/admin/config") and operation.method.upper() in ("PUT", "POST")
    keys = (TENANT_KEY, "sk-wrong") if editing else (TENANT_KEY, ADMIN_KEY, "sk-wrong")

    @given(case=operation.as_strategy())
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def fuzz(case: schemathesis.Case) -> None:
        for key in keys:
            headers = {**(case.headers or {}), "authorization": f"Bearer {key}"}
            response = case.call(base_url=fuzzed.url, headers=headers, timeout=30)
            assert response.status_code < 500, f"{operation.method} {operation.path}: {response.text}"
            content_type = (response.headers.get("content-type") or [""])[0]
            if response.status_code >= 400 and content_type.startswith("application/json"):
                error = response.json()["error"]
                assert error["message"] and "Traceback" not in error["message"]

    fuzz()


def test_schema_describes_the_generation_endpoints(fuzzed: RunningProcess) -> None:
    paths = httpx.get(fuzzed.url + "/openapi.json").json()["paths"]
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/admin/config"} <= set(paths)
