"""The ``spillgate sim-replica`` / ``sim-hosted`` commands: flags and a clean exit on SIGTERM."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

import httpx
import pytest

from spillgate.backends.sim import cli
from tests.support.procs import free_port, start_spillgate


def test_replica_flags_build_the_config() -> None:
    parser = argparse.ArgumentParser()
    cli.add_replica_arguments(parser)
    flags = "--port 9 --preset tiny-test --time-scale 0.01 --max-total-tokens 4010 --page-size 16"
    args = parser.parse_args([*flags.split(), "--chunked-prefill-size", "1024", "--max-running-requests", "8"])
    assert args.handler is cli.run_replica
    config = cli.replica_config_from_args(args)
    assert config.max_total_num_tokens == 4000  # whole 16-token pages
    assert config.scheduler_limits().chunked_prefill_size == 1024
    assert config.served_model_name == "meta-llama/Llama-3.1-8B-Instruct"
    with pytest.raises(SystemExit):
        parser.parse_args(["--port", "9", "--time-scale", "0"])


def test_hosted_flags_build_the_config() -> None:
    parser = argparse.ArgumentParser()
    cli.add_hosted_arguments(parser)
    args = parser.parse_args(["--port", "9", "--ttft-ms", "100", "--tpot-ms", "5"])
    assert args.handler is cli.run_hosted
    config = cli.hosted_config_from_args(args)
    assert (config.model_name, config.ttft_ms, config.tpot_ms, config.jitter) == ("frontier-large", 100, 5, 0.1)


def test_sigterm_mid_stream_ends_the_stream_and_exits_zero(tmp_path: Path) -> None:
    port = free_port()
    proc = start_spillgate(["sim-replica", "--port", str(port), "--time-scale", "0.05"], port=port, log_dir=tmp_path)
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50000, "stream": True}
        with httpx.stream("POST", proc.url + "/v1/chat/completions", json=body, timeout=10.0) as response:
            lines = response.iter_lines()
            next(lines)
            proc.popen.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
        assert '"finish_reason":"abort"' in rest[-2] and rest[-1] == "data: [DONE]"
        assert proc.popen.wait(timeout=10) == 0
    finally:
        proc.stop()
