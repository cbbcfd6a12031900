"""Chaos run: two gateway processes sharing one Redis, under steady load, while replicas, Redis and a gateway
are killed, stopped and restarted. Not part of ``make test`` (about two minutes):

    .venv/bin/python -m tests.chaos.run [--json FILE]

Everything runs on 127.0.0.1 and is stopped by PID: a private ``redis-server``, two simulated SGLang replicas,
one simulated hosted model and two gateways. A load tenant streams a request every 40 ms, alternating between
the gateways. At each Redis event a fresh budgeted tenant races a burst of requests at its hosted route over
both gateways. The schedule (seconds from the start of the load):

- 8: replica 0 is killed (``kill -9``); 12: restarted on its port.
- 18: replica 1 is stopped (SIGSTOP) for 4 s.
- 28: Redis restarts with its data (a saved snapshot); a budget race follows.
- 40: Redis restarts empty; a budget race follows on a tenant that had spent half its budget before.
- 46: a budget race paced over two seconds (a request every 10 ms, each taking most of a second), and Redis
  restarts empty 0.4 s into it, while the requests admitted so far still hold the budget.
- 51: 50 long hosted streams start on gateway 1, each with its own request id; 52: gateway 1 is killed
  (``kill -9``) while they stream; 55: restarted on its port with its data directory.

Then the gateways stop cleanly, and the report counts, from what the clients saw and what the ledgers hold:
requests sent; answered; answered 5xx by the gateway itself before a stream started (any 5xx whose error code
is not a backend's or a provider's); requests in flight on the killed gateway (cut off: it was killed);
requests refused by the killed gateway's closed port (a load balancer would send them to the other);
answered requests missing from both ledgers; each budget's overshoot in worst-case requests (for the
mid-race restart, also per gateway process: the promise is at most one); the streams the kill cut off, the
output tokens they had delivered, and how many of them no ledger booked (the restarted gateway books a
killed process's streams at their worst case); and how long each component took to serve again after it
came back.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from tests.support.gateway import replica_name
from tests.support.procs import RunningProcess, free_port, start_spillgate

LOAD_KEY = "sk-chaos-load"
BUDGET_USD = 0.02
"""Each budgeted tenant's daily budget: about 30 of its requests."""
BURST = 120
"""Requests each budget race sends at once, over both gateways."""
PRICES = {"input_per_mtok": 3.0, "output_per_mtok": 15.0}
MAX_TOKENS = 32
BACKEND_CODES = ("backend_", "hosted_")
MIDRACE_USD = 0.1
"""The mid-race tenant's daily budget: about 15 of its requests at their worst case."""
MIDRACE_REQUESTS = 200
MIDRACE_EVERY_S = 0.01
MIDRACE_RESTART_S = 0.4
MIDRACE_MAX_TOKENS = 400
"""Each mid-race request streams for most of a second, so the restart finds the budget held in flight."""
STREAMS = 50
STREAM_MAX_TOKENS = 1500
"""Each stream lasts about three seconds: all 50 are under way when their gateway is killed."""
GATEWAYS = 2


@dataclass
class Outcome:
    sent_at: float
    gateway: int
    status: int | None  # None: no HTTP answer
    code: str | None = None
    request_id: str | None = None
    backend: str | None = None
    streamed: bool = False
    refused_connection: bool = False
    tenant: str = "load"
    body_bytes: int = 0
    max_tokens: int = MAX_TOKENS
    tokens: int = 0
    """Output tokens delivered (counted for the tenants whose streams are matched to the ledgers)."""
    finished: bool = False
    """The stream's ``[DONE]`` arrived."""


@dataclass
class Run:
    base: Path
    redis_port: int
    redis: subprocess.Popen[bytes] | None = None
    replicas: list[RunningProcess] = field(default_factory=list)
    replica_ports: list[int] = field(default_factory=list)
    gateways: list[RunningProcess | None] = field(default_factory=list)
    gateway_ports: list[int] = field(default_factory=list)
    hosted: RunningProcess | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    events: dict[str, float] = field(default_factory=dict)
    recovery_s: dict[str, float] = field(default_factory=dict)
    t0: float = 0.0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def replica_name(self, index: int) -> str:
        """What the gateways call replica ``index`` (its address names it)."""
        return replica_name(f"http://127.0.0.1:{self.replica_ports[index]}")

    # Redis ---------------------------------------------------------------------------------------------

    def start_redis(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not installed")
        work = self.base / "redis"
        work.mkdir(exist_ok=True)
        self.redis = subprocess.Popen(
            [
                binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.redis_port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(work),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with contextlib.closing(__import__("redis").Redis(port=self.redis_port)) as client:
                    client.ping()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop_redis(self, *, save: bool) -> None:
        import redis

        assert self.redis is not None
        client = redis.Redis(port=self.redis_port)
        if save:
            client.save()
        else:
            (self.base / "redis" / "dump.rdb").unlink(missing_ok=True)
        self.redis.kill()
        self.redis.wait()
        client.close()

    # Processes -------------------------------------------------------------------------------------------

    def start_replica(self, index: int) -> None:
        port = self.replica_ports[index]
        proc = start_spillgate(
            [
                "sim-replica",
                "--port",
                str(port),
                "--model-name",
                "sim-model",
                "--time-scale",
                "0.05",
                "--enable-metrics",
                "--enable-cache-report",
            ],
            port=port,
            log_dir=self.base,
            ready_path="/ready",
        )
        if index < len(self.replicas):
            self.replicas[index] = proc
        else:
            self.replicas.append(proc)

    def start_gateway(self, index: int) -> None:
        port = self.gateway_ports[index]
        path = self.base / f"gateway{index}.yaml"
        path.write_text(yaml.safe_dump(self.config(index)))
        proc = start_spillgate(["serve", "--config", str(path), "--port", str(port)], port=port, log_dir=self.base)
        if index < len(self.gateways):
            self.gateways[index] = proc
        else:
            self.gateways.append(proc)

    def config(self, index: int) -> dict[str, Any]:
        assert self.hosted is not None
        budgeted = [
            {"name": name, "keys": [f"sk-chaos-{name}"], "routes": ["frontier"], "budget": {"usd_per_day": usd}}
            for name, usd in (("restart", BUDGET_USD), ("empty", BUDGET_USD), ("midrace", MIDRACE_USD))
        ]
        streams = {"name": "streams", "keys": ["sk-chaos-streams"], "routes": ["frontier"]}
        return {
            "pools": [
                {
                    "name": "pool",
                    "served_model": "sim-model",
                    "replicas": [f"http://127.0.0.1:{port}" for port in self.replica_ports],
                }
            ],
            "hosted_models": [
                {
                    "name": "frontier",
                    "model": "openai/frontier",
                    "api_base": self.hosted.url + "/v1",
                    "api_key": "sk-chaos-provider",
                    **PRICES,
                }
            ],
            "routes": [
                {"name": "chat", "targets": ["pool"], "policy": "cache_aware"},
                {"name": "frontier", "targets": ["frontier"]},
            ],
            "tenants": [{"name": "load", "keys": [LOAD_KEY], "routes": ["chat"]}, *budgeted, streams],
            "health": {"interval_s": 0.2, "timeout_s": 1.0, "unhealthy_after": 1},
            "state": {
                "data_dir": str(self.base / f"data{index}"),
                "redis_url": f"redis://127.0.0.1:{self.redis_port}/0",
                "key_prefix": "chaos",
            },
        }

    def stop_all(self) -> None:
        for proc in [*self.gateways, *self.replicas, self.hosted]:
            if proc is not None:
                proc.stop()
        if self.redis is not None and self.redis.poll() is None:
            self.redis.kill()
            self.redis.wait()


# The load --------------------------------------------------------------------------------------------------


async def send(
    run: Run,
    client: httpx.AsyncClient,
    gateway: int,
    key: str,
    model: str,
    tenant: str,
    *,
    max_tokens: int = MAX_TOKENS,
    request_id: str | None = None,
    count_tokens: bool = False,
) -> Outcome:
    outcome = Outcome(run.now(), gateway, None, tenant=tenant, max_tokens=max_tokens, request_id=request_id)
    url = f"http://127.0.0.1:{run.gateway_ports[gateway]}/v1/chat/completions"
    body = orjson.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": f"chaos {tenant} {len(run.outcomes)}"}],
            "max_tokens": max_tokens,
            "stream": True,
        }
    )
    outcome.body_bytes = len(body)  # the gateway holds a prompt of as many tokens as the body has bytes
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    if request_id is not None:
        headers["x-request-id"] = request_id
    try:
        async with client.stream("POST", url, content=body, headers=headers) as response:
            outcome.status = response.status_code
            outcome.request_id = response.headers.get("x-request-id", request_id)
            outcome.backend = response.headers.get("x-spillgate-backend")
            if response.status_code == 200:
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    outcome.streamed = True
                    if line == "data: [DONE]":
                        outcome.finished = True
                    elif count_tokens:
                        outcome.tokens += _content_tokens(line[6:])
            else:
                text = await response.aread()
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    outcome.code = json.loads(text)["error"]["code"]
    except httpx.ConnectError:
        outcome.refused_connection = True
    except httpx.HTTPError:
        pass
    run.outcomes.append(outcome)
    return outcome


def _content_tokens(data: str) -> int:
    """1 for a chunk that carries output text (the simulators send a token per chunk), else 0."""
    try:
        choices = orjson.loads(data).get("choices") or []
    except (orjson.JSONDecodeError, AttributeError):
        return 0
    return sum(1 for choice in choices if (choice.get("delta") or {}).get("content"))


async def steady_load(run: Run, client: httpx.AsyncClient, until: float) -> None:
    tasks: set[asyncio.Task[Outcome]] = set()
    index = 0
    while run.now() < until:
        task = asyncio.create_task(send(run, client, index % 2, LOAD_KEY, "chat", "load"))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        index += 1
        await asyncio.sleep(0.04)
    await asyncio.gather(*tasks)


async def budget_race(run: Run, client: httpx.AsyncClient, tenant: str) -> None:
    key = f"sk-chaos-{tenant}"
    await asyncio.gather(*(send(run, client, i % 2, key, "frontier", tenant) for i in range(BURST)))


async def midrace_restart(run: Run, client: httpx.AsyncClient) -> None:
    """Requests paced over both gateways, and Redis restarted empty while the first ones still hold the
    budget: their settles go to a Redis that never saw their holds, and each gateway notices one call at a time."""
    key = "sk-chaos-midrace"

    async def one(index: int) -> None:
        await asyncio.sleep(index * MIDRACE_EVERY_S)
        await send(run, client, index % 2, key, "frontier", "midrace", max_tokens=MIDRACE_MAX_TOKENS)

    async def restart() -> None:
        await asyncio.sleep(MIDRACE_RESTART_S)
        run.events["Redis killed mid-race"] = run.now()
        await asyncio.to_thread(run.stop_redis, save=False)
        await asyncio.to_thread(run.start_redis)
        back = run.events["Redis restarted empty mid-race"] = run.now()
        await wait_served(run, client, "Redis (restart empty mid-race)", back, lambda: gateways_healthy(run, client))

    await asyncio.gather(restart(), *(one(i) for i in range(MIDRACE_REQUESTS)))


async def start_streams(run: Run, client: httpx.AsyncClient) -> list[asyncio.Task[Outcome]]:
    """Long hosted streams on gateway 1, each with its own request id, to be cut off by its kill."""
    return [
        asyncio.create_task(
            send(
                run,
                client,
                1,
                "sk-chaos-streams",
                "frontier",
                "streams",
                max_tokens=STREAM_MAX_TOKENS,
                request_id=f"chaos-stream-{index:02d}-{os.urandom(4).hex()}",
                count_tokens=True,
            )
        )
        for index in range(STREAMS)
    ]


async def spend_half(run: Run, client: httpx.AsyncClient, tenant: str) -> None:
    """Requests one at a time until about half the budget is spent."""
    key = f"sk-chaos-{tenant}"
    for i in range(12):
        await send(run, client, i % 2, key, "frontier", tenant)


async def wait_served(run: Run, client: httpx.AsyncClient, name: str, since: float, check: Any) -> None:
    deadline = run.now() + 30
    while run.now() < deadline:
        if await check():
            run.recovery_s[name] = round(run.now() - since, 2)
            return
        await asyncio.sleep(0.05)
    run.recovery_s[name] = float("inf")


async def replica_serves(run: Run, client: httpx.AsyncClient, replica: str, after: float) -> bool:
    return any(o.backend == replica and o.sent_at >= after and o.status == 200 for o in run.outcomes)


async def gateways_healthy(run: Run, client: httpx.AsyncClient) -> bool:
    for port in run.gateway_ports:
        try:
            health = (await client.get(f"http://127.0.0.1:{port}/health")).json()
        except (httpx.HTTPError, ValueError):
            return False
        if health.get("status") != "ok":
            return False
    return True


async def schedule(run: Run, client: httpx.AsyncClient) -> None:
    async def at(second: float) -> None:
        await asyncio.sleep(max(0.0, second - run.now()))

    await at(8)
    run.replicas[0].popen.kill()
    run.events["replica 0 killed"] = run.now()
    await at(12)
    await asyncio.to_thread(run.start_replica, 0)
    back = run.events["replica 0 back"] = run.now()
    await wait_served(
        run, client, "replica 0 (restarted)", back, lambda: replica_serves(run, client, run.replica_name(0), back)
    )

    await at(18)
    os.killpg(run.replicas[1].popen.pid, signal.SIGSTOP)
    run.events["replica 1 stopped"] = run.now()
    await at(22)
    os.killpg(run.replicas[1].popen.pid, signal.SIGCONT)
    back = run.events["replica 1 continued"] = run.now()
    await wait_served(
        run, client, "replica 1 (stopped 4 s)", back, lambda: replica_serves(run, client, run.replica_name(1), back)
    )

    await at(28)
    await asyncio.to_thread(run.stop_redis, save=True)
    await asyncio.to_thread(run.start_redis)
    back = run.events["Redis restarted with its data"] = run.now()
    await wait_served(run, client, "Redis (restart with data)", back, lambda: gateways_healthy(run, client))
    await budget_race(run, client, "restart")

    await spend_half(run, client, "empty")
    await at(40)
    await asyncio.to_thread(run.stop_redis, save=False)
    await asyncio.to_thread(run.start_redis)
    back = run.events["Redis restarted empty"] = run.now()
    await wait_served(run, client, "Redis (restart empty)", back, lambda: gateways_healthy(run, client))
    await asyncio.sleep(3)  # the gateways' epoch checks (every 2 s) add their ledgers' totals back
    await budget_race(run, client, "empty")

    await at(46)
    run.events["mid-race restart race started"] = run.now()
    await midrace_restart(run, client)

    await at(51)
    streams = await start_streams(run, client)
    await at(52)
    gateway = run.gateways[1]
    assert gateway is not None
    os.killpg(gateway.popen.pid, signal.SIGKILL)
    gateway.popen.wait()
    killed = run.events["gateway 1 killed"] = run.now()
    await asyncio.gather(*streams)
    await at(55)
    await asyncio.to_thread(run.start_gateway, 1)
    back = run.events["gateway 1 back"] = run.now()

    async def gateway_serves() -> bool:
        return any(o.gateway == 1 and o.sent_at >= back and o.status == 200 for o in run.outcomes)

    await wait_served(run, client, "gateway 1 (killed, restarted)", back, gateway_serves)
    run.events["killed at"] = killed


# The report ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Booked:
    tenant: str
    cost_usd: float
    outcome: str
    completion_tokens: int


def ledger_entries(run: Run) -> dict[str, Booked]:
    """request id -> its entry, of every entry in both gateways' ledgers (the killed one's after its restart)."""
    found: dict[str, Booked] = {}
    for index in range(GATEWAYS):
        path = run.base / f"data{index}" / "ledger.sqlite3"
        with sqlite3.connect(path) as db:
            query = "SELECT request_id, tenant, cost_usd, outcome, completion_tokens FROM entries"
            for request_id, *row in db.execute(query):
                found[request_id] = Booked(*row)
    return found


def worst_case_usd(outcomes: list[Outcome]) -> float:
    """The dearest worst case the gateway held for one of ``outcomes`` (a hosted request at PRICES)."""
    return max(
        (o.body_bytes * PRICES["input_per_mtok"] + o.max_tokens * PRICES["output_per_mtok"]) / 1e6 for o in outcomes
    )


def midrace_budget(run: Run, ledger: dict[str, Booked]) -> dict[str, Any]:
    sent = [o for o in run.outcomes if o.tenant == "midrace"]
    spent = sum(b.cost_usd for b in ledger.values() if b.tenant == "midrace")
    worst = worst_case_usd(sent)
    over = max(0.0, spent - MIDRACE_USD) / worst
    started, killed = run.events["mid-race restart race started"], run.events["Redis killed mid-race"]
    back = run.events["Redis restarted empty mid-race"]
    return {
        "spent_usd": round(spent, 6),
        "budget_usd": MIDRACE_USD,
        "worst_case_usd": round(worst, 6),
        "overshoot_requests": round(over, 2),
        "overshoot_requests_per_process": round(over / GATEWAYS, 2),
        "admitted": sum(1 for o in sent if o.status == 200),
        "admitted_after_restart": sum(1 for o in sent if o.status == 200 and o.sent_at >= back),
        "refused_429": sum(1 for o in sent if o.status == 429),
        "killed_s_into_race": round(killed - started, 2),
        "back_s_into_race": round(back - started, 2),
    }


def cut_streams(run: Run, ledger: dict[str, Booked]) -> dict[str, Any]:
    """The streams gateway 1's kill cut off, from the client side, and whether a ledger booked each."""
    streams = [o for o in run.outcomes if o.tenant == "streams"]
    cut = [o for o in streams if o.streamed and not o.finished]
    unbooked = [o for o in cut if o.request_id not in ledger]
    booked = [ledger[o.request_id] for o in cut if o.request_id in ledger]
    return {
        "sent": len(streams),
        "streaming_when_killed": len(cut),
        "finished_before_the_kill": sum(1 for o in streams if o.finished),
        "never_started": sum(1 for o in streams if not o.streamed),
        "tokens_delivered_before_the_cut": sum(o.tokens for o in cut),
        "unbooked_streams": len(unbooked),
        "booked_at_worst_case": sum(1 for b in booked if b.outcome == "gateway_killed"),
        "booked_usd": round(sum(b.cost_usd for b in booked), 6),
        "worst_case_usd_of_the_cut": round(len(cut) * worst_case_usd(cut), 6) if cut else 0.0,
    }


def report(run: Run) -> dict[str, Any]:
    ledger = ledger_entries(run)
    killed_at, back_at = run.events["gateway 1 killed"], run.events["gateway 1 back"]
    answered = [o for o in run.outcomes if o.status is not None]
    own_5xx = [
        o for o in answered if o.status >= 500 and not o.streamed and not (o.code or "").startswith(BACKEND_CODES)
    ]
    cut_off = [o for o in run.outcomes if o.status is None and not o.refused_connection]
    refused = [o for o in run.outcomes if o.refused_connection]
    # The streams cut off on purpose are counted apart (cut_streams): a stream cut after its headers is a 200.
    served = [o for o in answered if o.status == 200 and o.request_id and o.tenant != "streams"]
    missing = [o.request_id for o in served if o.request_id not in ledger]
    budgets = {}
    for tenant in ("restart", "empty"):
        costs = [b.cost_usd for b in ledger.values() if b.tenant == tenant]
        spent = sum(costs)
        budgets[tenant] = {
            "spent_usd": round(spent, 6),
            "budget_usd": BUDGET_USD,
            # In requests of the dearest one booked: "at most one request per process" is at most 2 here.
            "overshoot_requests": round(max(0.0, spent - BUDGET_USD) / max(costs, default=1.0), 2),
            "admitted": sum(1 for o in answered if o.tenant == tenant and o.status == 200),
            "refused_429": sum(1 for o in answered if o.tenant == tenant and o.status == 429),
        }
    return {
        "requests_sent": len(run.outcomes),
        "answered": len(answered),
        "gateway_5xx_before_streaming": len(own_5xx),
        "gateway_5xx_codes": sorted({f"{o.status} {o.code}" for o in own_5xx}),
        "backend_5xx": sum(1 for o in answered if o.status >= 500 and o not in own_5xx),
        "cut_off_by_the_gateway_kill": len(cut_off),
        "cut_off_outside_the_kill": sum(1 for o in cut_off if not killed_at - 5 <= o.sent_at <= killed_at + 0.1),
        "refused_by_the_killed_gateway_port": len(refused),
        "refused_outside_its_downtime": sum(1 for o in refused if not killed_at <= o.sent_at <= back_at + 1),
        "served": len(served),
        "ledger_entries_missing": len(missing),
        "budgets": budgets,
        "midrace": midrace_budget(run, ledger),
        "streams": cut_streams(run, ledger),
        "recovery_s": run.recovery_s,
    }


def markdown(result: dict[str, Any]) -> str:
    budgets = result["budgets"]
    rows = [
        (
            "requests sent / answered / served 200",
            f"{result['requests_sent']} / {result['answered']} / {result['served']}",
        ),
        (
            "gateway 5xx before a stream started",
            f"{result['gateway_5xx_before_streaming']} {result['gateway_5xx_codes'] or ''}",
        ),
        ("backend 5xx (a replica or provider failed)", str(result["backend_5xx"])),
        (
            "cut off in flight by the gateway kill (outside it)",
            f"{result['cut_off_by_the_gateway_kill']} ({result['cut_off_outside_the_kill']})",
        ),
        (
            "refused by the killed gateway's port (outside its downtime)",
            f"{result['refused_by_the_killed_gateway_port']} ({result['refused_outside_its_downtime']})",
        ),
        ("ledger entries missing", str(result["ledger_entries_missing"])),
    ]
    for tenant, name in (("restart", "Redis restart with data"), ("empty", "Redis restart empty")):
        b = budgets[tenant]
        rows.append(
            (
                f"budget overshoot after {name}",
                f"{b['overshoot_requests']} requests (${b['spent_usd']} of ${b['budget_usd']}; "
                f"{b['admitted']} admitted, {b['refused_429']} refused)",
            )
        )
    m = result["midrace"]
    rows.append(
        (
            f"budget overshoot after Redis restart empty mid-race (killed {m['killed_s_into_race']} s in, "
            f"back at {m['back_s_into_race']} s)",
            f"{m['overshoot_requests_per_process']} worst-case requests per process, "
            f"{m['overshoot_requests']} in all (${m['spent_usd']} of ${m['budget_usd']}; worst case "
            f"${m['worst_case_usd']}; {m['admitted']} admitted, {m['admitted_after_restart']} after the restart, "
            f"{m['refused_429']} refused)",
        )
    )
    st = result["streams"]
    rows.append(
        (
            "hosted streams cut off by the gateway kill: unbooked",
            f"{st['unbooked_streams']} of {st['streaming_when_killed']} ({st['tokens_delivered_before_the_cut']} "
            f"output tokens delivered before the cut; {st['booked_at_worst_case']} booked at their worst case, "
            f"${st['booked_usd']} of ${st['worst_case_usd_of_the_cut']}; {st['finished_before_the_kill']} finished "
            f"before it, {st['never_started']} never started)",
        )
    )
    for name, seconds in result["recovery_s"].items():
        rows.append((f"serving again: {name}", f"{seconds} s"))
    lines = ["| measure | result |", "| --- | --- |", *(f"| {a} | {b} |" for a, b in rows)]
    return "\n".join(lines)


async def main_async(run: Run) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0), limits=httpx.Limits(max_connections=400)) as client:
        run.t0 = time.monotonic()
        load = asyncio.create_task(steady_load(run, client, until=62))
        await schedule(run, client)
        await load
    return report_after_stop(run)


def report_after_stop(run: Run) -> dict[str, Any]:
    for gateway in run.gateways:
        if gateway is not None:
            gateway.stop()  # a clean stop commits what is queued
    return report(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to FILE")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="spillgate-chaos-"))
    run = Run(base=base, redis_port=free_port())
    run.replica_ports = [free_port(), free_port()]
    run.gateway_ports = [free_port(), free_port()]
    try:
        run.start_redis()
        for index in range(2):
            run.start_replica(index)
        hosted_port = free_port()
        run.hosted = start_spillgate(
            ["sim-hosted", "--port", str(hosted_port), "--ttft-ms", "30", "--tpot-ms", "2", "--model-name", "frontier"],
            port=hosted_port,
            log_dir=base,
        )
        for index in range(2):
            run.start_gateway(index)
        result = asyncio.run(main_async(run))
    finally:
        run.stop_all()
    print(markdown(result))
    print(f"\nlogs: {base}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
