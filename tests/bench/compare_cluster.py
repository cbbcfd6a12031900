"""The simulated replicas a router comparison shares, and the relays it puts in front of them in turn.

Every process is started in its own session and stopped by the PID it was started with (sglang-router renames
itself, and other engineers' gateways may run on the machine). Nothing is pinned: on a 2-core machine the
replicas, the relay and the load generator share both cores, which the time scale leaves room for.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spillgate.gateway.control.config import RECOMMENDED_SGLANG_FLAGS
from tests.bench.services import REPO_ROOT, Service, free_port, http_request, wait_until

PRESET = "llama-3.1-8b-h100"
MODEL = "sim-llama-8b"
ROUTE = "chat"
API_KEY = "sk-spillgate-compare"
SPILLGATE_POLICIES = ("cache_aware", "least_load", "round_robin", "power_of_two", "consistent_hash")
ROUTER_POLICIES = ("cache_aware", "round_robin")
SIM_PREFILL_TOKENS_PER_S = 20000.0
SLO_TTFT_MS = 1000.0
SLO_TPOT_MS = 50.0
"""The SLO goodput is judged by, simulated; the gateway's tenant is given it too (in wall time), as a user would."""
"""What the gateway is told a replica prefills per simulated second (``prefill_tokens_per_s`` / time scale)."""

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 only: ignore *_proxy


def start(name: str, argv: Sequence[str], log_dir: Path) -> Service:
    """Run ``argv`` from the repo root in a session of its own, output to ``log_dir/name.log``."""
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            list(argv),
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
    return Service(name, popen, log_path)


def post(url: str, timeout: float = 10.0) -> int:
    """Status of an empty POST; 0 when nothing answered."""
    request = urllib.request.Request(url, data=b"", method="POST")
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return 0


# CPU accounting --------------------------------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK")
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal


def machine_busy_s() -> float:
    """CPU seconds all cores have been busy since boot."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    return sum(fields[i] for i in _BUSY_FIELDS) / _TICKS


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


@dataclass
class CpuWatch:
    """Started before a run, read after it: cores used by the run's own processes, and by everything else.

    Other engineers' test suites may share the machine; a run with much other work is flagged, not hidden.
    """

    pids: tuple[int, ...]
    _wall: float = 0.0
    _busy: float = 0.0
    _own: float = 0.0

    def __post_init__(self) -> None:
        self._wall, self._busy, self._own = time.monotonic(), machine_busy_s(), self._own_s()

    def _own_s(self) -> float:
        return sum(process_cpu_s(pid) for pid in self.pids) + sum(os.times()[:2])

    def cores(self) -> tuple[float, float]:
        """(own cores, other cores), averaged over the time since the watch started."""
        wall = max(time.monotonic() - self._wall, 1e-9)
        own = (self._own_s() - self._own) / wall
        busy = (machine_busy_s() - self._busy) / wall
        return own, max(0.0, busy - own)


def wait_for_quiet(*, below_cores: float = 0.3, window_s: float = 0.5, timeout_s: float = 5.0) -> float:
    """Between runs, wait (a little) for other work on the machine to ease; returns the last window's busy cores."""
    deadline = time.monotonic() + timeout_s
    while True:
        before = machine_busy_s()
        time.sleep(window_s)
        busy = (machine_busy_s() - before) / window_s
        if busy < below_cores or time.monotonic() >= deadline:
            return busy


# Replica counters ------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^(sglang:[a-z0-9_]+)(?:\{[^}]*\})?\s+([0-9.eE+-]+|NaN)$")
_COUNTERS = {
    "sglang:num_requests_total": "requests",
    "sglang:prompt_tokens_total": "prompt_tokens",
    "sglang:cached_tokens_total": "cached_tokens",
    "sglang:time_to_first_token_seconds_sum": "ttft_sum_s",
    "sglang:time_to_first_token_seconds_count": "ttft_count",
    "sglang:e2e_request_latency_seconds_sum": "e2e_sum_s",
    "sglang:e2e_request_latency_seconds_count": "e2e_count",
}


@dataclass
class ReplicaCounters:
    """A replica's cumulative request counters, in simulated seconds; a run's figures are the differences."""

    requests: float = 0.0
    prompt_tokens: float = 0.0
    cached_tokens: float = 0.0
    ttft_sum_s: float = 0.0
    ttft_count: float = 0.0
    e2e_sum_s: float = 0.0
    e2e_count: float = 0.0

    def minus(self, earlier: ReplicaCounters) -> ReplicaCounters:
        return ReplicaCounters(**{k: getattr(self, k) - getattr(earlier, k) for k in _COUNTERS.values()})

    def plus(self, other: ReplicaCounters) -> ReplicaCounters:
        return ReplicaCounters(**{k: getattr(self, k) + getattr(other, k) for k in _COUNTERS.values()})


def parse_counters(text: str) -> ReplicaCounters:
    """Sum each counter over its label sets (streaming or not, cache source)."""
    counters = ReplicaCounters()
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) in _COUNTERS and match.group(2) != "NaN":
            key = _COUNTERS[match.group(1)]
            setattr(counters, key, getattr(counters, key) + float(match.group(2)))
    return counters


# The replicas ----------------------------------------------------------------------------------------


@dataclass
class Cluster:
    """N simulated replicas on free ports, stopped by PID; the same ones serve every row.

    All share the default seed, so a prompt gets the same reply whichever replica serves it and a chat
    conversation's later turns are the same text under every router.
    """

    time_scale: float
    log_dir: Path
    services: list[Service] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    kv_endpoints: list[str] = field(default_factory=list)
    """Where each replica publishes its KV-cache events (``start(kv_events=True)``), in replica order."""

    def start(
        self,
        count: int,
        extra_args: Sequence[str] = (),
        name: str = "replica",
        *,
        bare: bool = False,
        kv_events: bool = False,
    ) -> None:
        """``count`` replicas with the recommended SGLang flags, or (``bare``) on SGLang's own defaults; with
        ``kv_events`` each publishes its KV-cache events as SGLang does (ZMQ PUB, bound, with a replay socket),
        on ports of its own, and reports them in ``/server_info``."""
        extra_args = [*(() if bare else RECOMMENDED_SGLANG_FLAGS), *extra_args]
        for index in range(count):
            port = free_port()
            events: list[str] = []
            if kv_events:
                endpoint = f"tcp://127.0.0.1:{free_port()}"
                replay = f"tcp://127.0.0.1:{free_port()}"
                publish = {"publisher": "zmq", "endpoint": endpoint, "bind": True, "topic": "kv"}
                events = ["--kv-events-config", json.dumps({**publish, "replay_endpoint": replay})]
                self.kv_endpoints.append(endpoint)
            argv = [
                sys.executable, "-m", "spillgate.gateway.cli", "sim-replica", "--port", str(port), "--preset", PRESET,
                "--time-scale", f"{self.time_scale:g}", "--model-name", MODEL, *extra_args, *events,
            ]  # fmt: skip
            self.services.append(start(f"{name}-{index}", argv, self.log_dir))
            self.urls.append(f"http://127.0.0.1:{port}")
        for service, url in zip(self.services, self.urls, strict=True):
            wait_until(service, lambda url=url: http_request(url + "/ready")[0] == 200, timeout=60, what="/ready")

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()

    def flush(self, timeout_s: float = 120.0) -> None:
        """Empty every replica's prefix cache; a replica refuses while busy, so ask until it says 200."""
        deadline = time.monotonic() + timeout_s
        for url in self.urls:
            while post(url + "/flush_cache?timeout=2") != 200:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url}/flush_cache did not answer 200 within {timeout_s:g}s")
                time.sleep(0.2)

    def capacity_tokens(self) -> int:
        """The first replica's KV pool, in tokens (``max_total_num_tokens``)."""
        status, body = http_request(self.urls[0] + "/get_server_info")
        if status != 200:
            raise RuntimeError(f"{self.urls[0]}/get_server_info answered {status}")
        return int(json.loads(body)["max_total_num_tokens"])

    def counters(self) -> list[ReplicaCounters]:
        result = []
        for url in self.urls:
            # The simulator's own copy of /metrics: replicas on SGLang's bare defaults serve no /metrics.
            status, body = http_request(url + "/sim/metrics")
            if status != 200:
                raise RuntimeError(f"{url}/sim/metrics answered {status}")
            result.append(parse_counters(body.decode()))
        return result


# The relays ------------------------------------------------------------------------------------------


@dataclass
class Relay:
    """A router or gateway in front of the cluster: what clients call, and how to stop it."""

    name: str
    policy: str
    service: Service
    url: str
    model: str
    api_key: str | None
    command: str
    config: dict[str, Any] | None = None
    more_services: tuple[Service, ...] = ()
    """The other processes of a gateway run as several (``--gateways``), answering at ``more_urls``."""
    more_urls: tuple[str, ...] = ()

    @property
    def services(self) -> tuple[Service, ...]:
        return (self.service, *self.more_services)

    def running(self) -> bool:
        return all(service.running() for service in self.services)

    def log_tail(self) -> str:
        return "\n".join(service.log_tail() for service in self.services if not service.running())

    def stop(self) -> None:
        for service in self.services:
            service.stop()


def gateway_config(
    urls: Sequence[str],
    policy: str,
    port: int,
    time_scale: float,
    route: Mapping[str, Any] | None = None,
    *,
    pool: Mapping[str, Any] | None = None,
    prefix: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One pool over the replicas, one route with ``policy`` (and the settings in ``route``, such as its
    ``weights`` or ``affinity``), one tenant (its key stored as a digest, its SLO the bench's). ``pool`` adds
    settings to the pool (``kv_events``), ``prefix`` is the config's ``prefix`` section (``tokenizer``).

    ``prefill_tokens_per_s`` is per wall second, which the gateway measures in: the replicas run
    ``1 / time_scale`` times real speed.
    """
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "health": {"interval_s": 0.5},
        "limits": {"max_connections_per_client": 0},  # the load generator is one address with many connections
        "pools": [
            {
                "name": "sims",
                "served_model": MODEL,
                "replicas": list(urls),
                "prefill_tokens_per_s": SIM_PREFILL_TOKENS_PER_S / time_scale,
                **(pool or {}),
            }
        ],
        "routes": [{"name": ROUTE, "targets": ["sims"], "policy": policy, **(route or {})}],
        "tenants": [
            {
                "name": "bench",
                "keys": ["sha256:" + hashlib.sha256(API_KEY.encode()).hexdigest()],
                "slo": {"ttft_ms": SLO_TTFT_MS * time_scale, "tpot_ms": SLO_TPOT_MS * time_scale},
            }
        ],
    }
    if prefix:
        config["prefix"] = dict(prefix)
    return config


def start_spillgate(
    cluster: Cluster,
    policy: str,
    trace: Path | None = None,
    route: Mapping[str, Any] | None = None,
    *,
    processes: int = 1,
    redis_url: str | None = None,
    pool: Mapping[str, Any] | None = None,
    prefix: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> Relay:
    """The gateway over the cluster; with ``trace``, one JSON line per request there (``trace_gateway``);
    ``route``: more settings for its route (see :func:`gateway_config`). With ``processes`` > 1, that many
    gateway processes sharing their state through ``redis_url`` (under a key prefix of this start's own), as a
    deployment behind a load balancer runs: the bench rotates over them. ``pool`` and ``prefix``: see
    :func:`gateway_config`; ``name`` names its logs (default ``spillgate-POLICY``)."""
    if processes > 1 and not redis_url:
        raise ValueError("several gateway processes share their state through Redis: pass redis_url")
    key_prefix = f"compare-{os.getpid()}-{time.time_ns()}"
    services: list[Service] = []
    urls: list[str] = []
    argvs: list[str] = []
    config: dict[str, Any] = {}
    try:
        for index in range(processes):
            port = free_port()
            config = gateway_config(cluster.urls, policy, port, cluster.time_scale, route, pool=pool, prefix=prefix)
            process = (name or f"spillgate-{policy}") + (f"-{index}" if processes > 1 else "")
            if processes > 1:
                data_dir = str(cluster.log_dir / process)
                config["state"] = {"redis_url": redis_url, "key_prefix": key_prefix, "data_dir": data_dir}
            path = cluster.log_dir / f"{process}.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            entry = ["spillgate.gateway.cli"] if trace is None else ["tests.bench.trace_gateway", "--trace", str(trace)]
            argv = [sys.executable, "-m", *entry, "serve", "--config", str(path), "--port", str(port)]
            services.append(start(process, argv, cluster.log_dir))
            urls.append(f"http://127.0.0.1:{port}")
            argvs.append(" ".join(argv))
        for service, url in zip(services, urls, strict=True):
            _wait_all_healthy(service, url, len(cluster.urls))
    except BaseException:
        for service in services:
            service.stop()
        raise
    time.sleep(1.0)  # two scrapes at interval_s 0.5: server info and metrics are in
    return Relay(
        "spillgate",
        policy,
        services[0],
        urls[0],
        ROUTE,
        API_KEY,
        " && ".join(argvs),
        config,
        more_services=tuple(services[1:]),
        more_urls=tuple(urls[1:]),
    )


def _wait_all_healthy(service: Service, url: str, count: int) -> None:
    """Ready is not enough: the first requests must see every replica, with its metrics scraped once."""

    def healthy() -> bool:
        status, body = http_request(url + "/health")
        return status == 200 and body.count(b'"healthy":true') + body.count(b'"healthy": true') >= count

    wait_until(service, healthy, timeout=60, what=f"/health listing {count} healthy backends")


def start_router(python: str, cluster: Cluster, policy: str) -> Relay:
    """sglang-router with its defaults but the policy, a quiet log and a metrics port that cannot collide. Its
    5 s health-check timeout is in simulated seconds like everything else: SGLang's /health answers after a
    (simulated) second, six wall seconds at time scale 6."""
    port = free_port()
    health_timeout = max(5, round(5 * cluster.time_scale))
    argv = [
        python, "-m", "sglang_router.launch_router", "--worker-urls", *cluster.urls, "--policy", policy,
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warn", "--prometheus-port", str(free_port()),
        "--health-check-timeout-secs", str(health_timeout),
    ]  # fmt: skip
    service = start(f"sglang-router-{policy}", argv, cluster.log_dir)
    relay = Relay("sglang-router", policy, service, f"http://127.0.0.1:{port}", MODEL, None, " ".join(argv))
    _wait_routing(relay)
    return relay


def start_smg(binary: str, cluster: Cluster, policy: str) -> Relay:
    """Shepherd Model Gateway (``smg launch``) over the cluster's HTTP workers, with its defaults but the policy,
    its log quiet, its metrics on a loopback port that cannot collide, and its health-check timeout stretched by
    the time scale as sglang-router's is. Over HTTP it routes ``cache_aware`` on its approximate prefix tree of
    the request text: its event-driven index is fed by workers it tokenizes for (gRPC), which these are not."""
    port = free_port()
    health_timeout = max(5, round(5 * cluster.time_scale))
    argv = [
        binary, "launch", "--worker-urls", *cluster.urls, "--policy", policy, "--host", "127.0.0.1",
        "--port", str(port), "--log-level", "warn", "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(free_port()), "--health-check-timeout-secs", str(health_timeout),
    ]  # fmt: skip
    service = start(f"smg-{policy}", argv, cluster.log_dir)
    relay = Relay("smg", policy, service, f"http://127.0.0.1:{port}", MODEL, None, " ".join(argv))
    _wait_routing(relay)
    return relay


def _wait_routing(relay: Relay) -> None:
    """Until a chat completion through ``relay`` answers 200 (its workers registered and healthy)."""
    try:
        body = b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}'
        headers = {"content-type": "application/json"}

        def routes() -> bool:
            return http_request(relay.url + "/v1/chat/completions", body=body, headers=headers)[0] == 200

        wait_until(relay.service, routes, timeout=60, what="a chat completion answering 200")
    except BaseException:
        relay.stop()
        raise
