"""A fresh interpreter that imports and uses the hosted client while recording every socket connect and
name lookup (refusing any not to 127.0.0.1), then reports them as JSON on its last line of output.

It runs in a directory holding a ``.env`` file, which litellm must not load into the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.procs import REPO_ROOT

PROBE = r"""
import asyncio, json, os, sys, threading, time

events = []

def audit(event, args):
    if event == "socket.connect":
        address = args[1]
        events.append(["connect", list(address) if isinstance(address, tuple) else repr(address)])
        if not (isinstance(address, tuple) and address[0] == "127.0.0.1"):
            raise ConnectionRefusedError("network disabled by the probe")
    elif event == "socket.getaddrinfo":
        events.append(["getaddrinfo", repr(args[0])])
        if args[0] not in ("127.0.0.1", b"127.0.0.1"):
            raise OSError("name lookup disabled by the probe")
    elif event == "urllib.Request":
        events.append(["urllib", args[0]])

sys.addaudithook(audit)
started = time.perf_counter()
from spillgate.backends.hosted.client import complete
import_s = time.perf_counter() - started

from spillgate.backends.hosted import HostedModel
from spillgate.backends.hosted.pricing import price_for
from litellm.litellm_core_utils.get_model_cost_map import get_model_cost_map_source_info

for key in ("anthropic/claude-sonnet-4-5", "openai/gpt-4o", "bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0"):
    price_for(key)

async def requests(url, key):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    for name, base in (("openai/frontier-large", url + "/v1"), ("anthropic/claude-sonnet-4-5", url)):
        model = HostedModel("m", name, api_base=base, api_key=key, timeout_s=10)
        await complete(model, body)
        stream = await complete(model, {**body, "stream": True})
        async for _ in stream:
            pass

asyncio.run(requests(sys.argv[1], sys.argv[2]))
time.sleep(0.2)
print(json.dumps({
    "events": events,
    "import_s": import_s,
    "cost_map": get_model_cost_map_source_info(),
    "threads": [thread.name for thread in threading.enumerate()],
    "dotenv": os.environ.get("SPILLGATE_DOTENV_PROBE"),
}))
"""


@dataclass
class OfflineProbe:
    """The probe's process; ``report()`` waits for it and returns what it saw."""

    popen: subprocess.Popen[str]

    @classmethod
    def start(cls, sim_url: str, api_key: str, workdir: Path) -> OfflineProbe:
        env = {key: value for key, value in os.environ.items() if not key.startswith("LITELLM_")}
        (workdir / ".env").write_text("SPILLGATE_DOTENV_PROBE=loaded\n")
        popen = subprocess.Popen(
            [sys.executable, "-c", PROBE, sim_url, api_key],
            cwd=workdir,
            env={**env, "PYTHONPATH": str(REPO_ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return cls(popen)

    def report(self, timeout: float = 120.0) -> dict[str, Any]:
        stdout, stderr = self.popen.communicate(timeout=timeout)
        assert self.popen.returncode == 0, stderr[-3000:]
        return json.loads(stdout.strip().splitlines()[-1])

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.communicate()
