"""Simulated providers for the hosted-client tests: one ``sim-hosted`` per behaviour, stopped by PID.

All are started together (in parallel) the first time a test needs one, and serve both wire formats:
``openai/<model>`` with ``api_base=<sim>/v1`` and ``anthropic/<model>`` with ``api_base=<sim>``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from spillgate.backends.hosted import HostedCompletion, HostedModel, HostedStream, PriceOverride
from tests.hosted.probe import OfflineProbe
from tests.support.procs import RunningProcess, free_port, start_spillgate

API_KEY = "sk-spillgate-test-7Hq2SECRETkey0x9"
ANTHROPIC_MODEL = "anthropic/claude-sonnet-4-5"  # in litellm's bundled price map
OPENAI_MODEL = "openai/frontier-large"  # not in the map: priced by an override
OPENAI_PRICE = PriceOverride(input_per_mtok=2.0, output_per_mtok=8.0, cached_input_per_mtok=0.5)
STALL_TIMEOUT_S = 0.6
SLOW_TPOT_MS = 250.0

_QUIET = ("--jitter", "0", "--seed", "7")
SIM_ARGS = {
    "fast": ("--ttft-ms", "20", "--tpot-ms", "2", *_QUIET),
    "slow": ("--ttft-ms", "20", "--tpot-ms", str(SLOW_TPOT_MS), *_QUIET),
    # request 1 answers, 2 is a 429, 3 a 500, 4 a 429, 5 answers: a retry inside litellm would show
    "faults-openai": ("--ttft-ms", "5", "--tpot-ms", "1", "--fail-429-every", "2", "--fail-500-every", "3", *_QUIET),
    "faults-anthropic": ("--ttft-ms", "5", "--tpot-ms", "1", "--fail-429-every", "2", "--fail-500-every", "3", *_QUIET),
    "stall": ("--ttft-ms", "5", "--tpot-ms", "5", "--stall-after-chunks", "2", *_QUIET),
    "malformed": ("--ttft-ms", "5", "--tpot-ms", "5", "--malformed-after-chunks", "2", *_QUIET),
}


@dataclass(frozen=True)
class Sims:
    """The running simulators by name (keys of SIM_ARGS)."""

    procs: dict[str, RunningProcess]

    def __getitem__(self, name: str) -> RunningProcess:
        return self.procs[name]


@pytest.fixture(scope="session")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sims]:
    log_dir = tmp_path_factory.mktemp("hosted-sims")

    def start(args: tuple[str, ...]) -> RunningProcess:
        port = free_port()
        return start_spillgate(["sim-hosted", "--port", str(port), *args], port=port, log_dir=log_dir)

    with ThreadPoolExecutor(max_workers=len(SIM_ARGS)) as pool:
        futures = {name: pool.submit(start, args) for name, args in SIM_ARGS.items()}
    started = {name: future.result() for name, future in futures.items() if future.exception() is None}
    try:
        failed = [future.exception() for future in futures.values() if future.exception() is not None]
        if failed:
            raise failed[0]  # type: ignore[misc]
        yield Sims(started)
    finally:
        with ThreadPoolExecutor(max_workers=len(SIM_ARGS)) as pool:
            list(pool.map(RunningProcess.stop, started.values()))


@pytest.fixture(scope="session")
def offline_probe(sims: Sims, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OfflineProbe]:
    """The no-network probe (test_offline), started with the simulators so that its interpreter's slow
    litellm import runs alongside the other tests instead of after them."""
    probe = OfflineProbe.start(sims["fast"].url, API_KEY, tmp_path_factory.mktemp("offline-probe"))
    yield probe
    probe.stop()


ModelFor = Callable[..., HostedModel]


class _DirectPath:
    """The HTTP client :func:`complete` passes on while a test runs as ``openai-direct``; None otherwise."""

    http: httpx.AsyncClient | None = None


DIRECT_PATH = _DirectPath()


@pytest.fixture(params=["openai", "openai-direct", "anthropic"])
async def provider(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """The wire format a test runs in: OpenAI's through litellm, OpenAI's streams relayed without litellm
    (``backends.hosted.direct``), or Anthropic's through litellm."""
    if request.param != "openai-direct":
        yield request.param
        return
    async with httpx.AsyncClient() as http:
        DIRECT_PATH.http = http
        try:
            yield request.param
        finally:
            DIRECT_PATH.http = None


async def complete(model: HostedModel, payload: Mapping[str, Any]) -> HostedCompletion | HostedStream:
    """:func:`backends.hosted.client.complete`, on the direct path when the test runs as ``openai-direct``."""
    from spillgate.backends.hosted.client import complete as client_complete

    return await client_complete(model, payload, http=DIRECT_PATH.http)


def hosted_model(url: str, provider: str, **overrides: object) -> HostedModel:
    """A priced HostedModel for ``provider``'s wire format on the simulator at ``url``."""
    if provider in ("openai", "openai-direct"):
        model = HostedModel("frontier", OPENAI_MODEL, api_base=url + "/v1", api_key=API_KEY, timeout_s=10.0)
        model = model.with_price(OPENAI_PRICE)
    else:
        model = HostedModel("claude", ANTHROPIC_MODEL, api_base=url, api_key=API_KEY, timeout_s=10.0).with_price()
    return dataclasses.replace(model, **overrides)  # type: ignore[arg-type]


@pytest.fixture
def model_for(sims: Sims, provider: str, offline_probe: OfflineProbe) -> ModelFor:
    """``model_for("stall", timeout_s=0.5)``: a HostedModel of the current provider on that simulator."""

    def build(sim: str, **overrides: object) -> HostedModel:
        return hosted_model(sims[sim].url, provider, **overrides)

    return build


def pytest_configure(config: pytest.Config) -> None:
    # litellm's own pydantic usage (deprecated attributes, ReadOnly TypedDicts) warns per chunk: not ours to fix.
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:litellm")
    config.addinivalue_line("filterwarnings", "ignore:.*ReadOnly. qualifier:UserWarning")
