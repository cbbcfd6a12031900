"""Start real SGLang and vLLM servers on 127.0.0.1, on a CPU, serving the tiny model; stopped by PID.

The flags are what a CPU needs (``--device cpu``, a small KV pool) plus what the caller asks for: the engines'
defaults otherwise, so a test sees what an operator who starts them plainly would.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tests.engines.install import Installed
from tests.support.procs import RunningProcess, free_port, start_process

SERVED_MODEL = "tiny"
RECOMMENDED = {"sglang": ("--enable-metrics", "--enable-cache-report"), "vllm": ("--enable-prompt-tokens-details",)}
"""The flags the README tells operators to add, so the gateway gets every signal it uses."""
START_TIMEOUT_S = 300.0


def start_engine(
    installed: Installed,
    engine: str,
    log_dir: Path,
    *flags: str,
    port: int | None = None,
    kv_tokens: int = 65536,
    context: int | None = None,
    env: dict[str, str] | None = None,
) -> RunningProcess:
    """One server of ``engine`` with ``flags`` added, its KV cache holding about ``kv_tokens`` tokens and its context
    ``context`` tokens (default the model's; vLLM refuses a KV cache that cannot hold one whole context)."""
    port = port or free_port()
    start = {"sglang": _sglang_command, "vllm": _vllm_command}[engine]
    command, ready, engine_env = start(installed, port, kv_tokens, context, flags)
    return start_process(
        command,
        port=port,
        log_dir=log_dir,
        ready_path=ready,
        timeout=START_TIMEOUT_S,
        env={**engine_env, **(env or {})},
        name=engine,
    )


def _sglang_command(
    installed: Installed, port: int, kv_tokens: int, context: int | None, flags: Sequence[str]
) -> tuple[list[str], str, dict[str, str]]:
    command = [
        *_serving(installed, "sglang", "sglang.launch_server", "--model-path", port),
        "--device",
        "cpu",
        "--disable-cuda-graph",
        "--mem-fraction-static",
        "0.05",
        "--max-total-tokens",
        str(kv_tokens),
        *(("--context-length", str(context)) if context else ()),
        *flags,
    ]
    # /ready answers at once and says 200 only once the server is Up (its warm-up done); /health takes a second.
    return command, "/ready", {}


def _vllm_command(
    installed: Installed, port: int, kv_tokens: int, context: int | None, flags: Sequence[str]
) -> tuple[list[str], str, dict[str, str]]:
    command = [
        *_serving(installed, "vllm", "vllm.entrypoints.openai.api_server", "--model", port),
        "--max-model-len",
        str(context or model_context(installed)),
        # vLLM on a CPU reserves its KV cache in whole GiB (VLLM_CPU_KVCACHE_SPACE, 1 GiB is half a million tokens
        # of the tiny model); the block count caps what it uses, in blocks of 128 tokens on a CPU.
        "--num-gpu-blocks-override",
        str(max(1, kv_tokens // 128)),
        *flags,
    ]
    return command, "/health", {"VLLM_CPU_KVCACHE_SPACE": "1"}


def _serving(installed: Installed, engine: str, module: str, model_flag: str, port: int) -> list[str]:
    """The start of either engine's command: its Python and server module, the tiny model on 127.0.0.1."""
    python = str(installed.python[engine])
    address = ["--host", "127.0.0.1", "--port", str(port)]
    return [python, "-m", module, model_flag, str(installed.model), "--served-model-name", SERVED_MODEL, *address]


def model_context(installed: Installed) -> int:
    return int(json.loads((installed.model / "spillgate-model.json").read_text())["context_length"])
