"""The keys file in a data directory that several gateway processes share (``serve --workers``): processes
writing it at the same moment never fail each other."""

from __future__ import annotations

import json
import multiprocessing
from multiprocessing.synchronize import Barrier
from pathlib import Path

from spillgate.gateway.control.config_history import Destination
from spillgate.gateway.control.secret_store import SecretStore

WRITES = 40


def _writer(path: str, worker: int, start: Barrier) -> None:
    """One process keeping a new key, then forgetting it, ``WRITES`` times: each keep writes the file."""
    store = SecretStore(Path(path))
    destination = Destination("pool", ("sglang",), frozenset({f"http://127.0.0.1:{7000 + worker}"}))
    start.wait()
    for index in range(WRITES):
        store.keep({("pools", f"pool-{worker}"): (destination, f"sk-{worker}-{index}")}, {})


def test_two_processes_writing_the_keys_file_at_once_both_succeed(tmp_path: Path) -> None:
    path = tmp_path / "config-secrets.spillgate.json"
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2)
    writers = [context.Process(target=_writer, args=(str(path), worker, start)) for worker in (1, 2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=120)
    assert [writer.exitcode for writer in writers] == [0, 0], "a write failed (see the traceback above)"
    kept = json.loads(path.read_text())  # whole: one process's last write
    assert kept and all(item["key"] == f"sk-{item['name'][-1]}-{WRITES - 1}" for item in kept)
    assert [p.name for p in tmp_path.iterdir()] == [path.name], "no staging file is left behind"


def test_a_key_kept_by_one_process_is_neither_dropped_by_another_nor_hidden_from_it(tmp_path: Path) -> None:
    path = tmp_path / "config-secrets.spillgate.json"
    first, second = SecretStore(path), SecretStore(path)  # two workers, each with what it read at start
    one = Destination("pool", ("a",), frozenset({"http://127.0.0.1:7001"}))
    two = Destination("pool", ("b",), frozenset({"http://127.0.0.1:7002"}))
    first.keep({("pools", "a"): (one, "sk-a")}, {})
    second.keep({("pools", "b"): (two, "sk-b")}, {})
    assert {item["name"]: item["key"] for item in json.loads(path.read_text())} == {"a": "sk-a", "b": "sk-b"}
    assert first.refreshed()[("pools", "b")] == (two, "sk-b")
    assert SecretStore(path).keys() == first.keys()
