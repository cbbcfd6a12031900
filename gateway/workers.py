"""``spillgate serve --workers N``: N gateway processes behind one listening socket, acting as one gateway.

The parent binds the socket, starts what the workers share (the embedded simulators, a private Redis when the
config names none), and starts each worker as a fresh interpreter (``spillgate serve --worker-of SPEC``) that
inherits the socket, as gunicorn and uvicorn's own multiprocess supervisor do: the kernel hands each new
connection to whichever worker accepts first, a worker that dies leaves the socket open for the others, and its
replacement takes the same socket. Budgets, rate limits, config versions, prefix beliefs and load are shared
through Redis (:doc:`docs/multi-process.md`); the ledger directory is shared too (its files are per process).

uvicorn's ``Multiprocess`` is not used: it pickles the uvicorn config into each worker, and the gateway's app and
protocol are built from the parsed config and the parent's simulators, not importable by name; and it waits for
a stopping worker without a deadline. The parent here forwards SIGTERM/SIGINT, waits for the workers' drain
(``timeouts.drain_s``) plus a margin, and kills what is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from spillgate.gateway.control.config import GatewayConfig, StateConfig
from spillgate.gateway.supervisor import die_with_parent

STOP_MARGIN_S = 15.0
"""Beyond the drain deadline, how long a stopping worker gets to close its books and exit before it is killed."""
START_TIMEOUT_S = 120.0
"""How long a worker may take to serve, from its start (it loads the config, litellm and tokenizers)."""
_SHORT_LIFE_S = 5.0
_MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class WorkerSpec:
    """What the parent hands a worker, on its command line: the inherited socket, where to say it serves, and
    what the parent started for every worker."""

    socket_fd: int
    ready_fd: int
    index: int
    replica_urls: dict[str, list[str]] = field(default_factory=dict)
    hosted_urls: dict[str, str] = field(default_factory=dict)
    redis_url: str | None = None
    """The parent's private Redis (``unix://``: it has no TCP port); None when the config names one (the worker
    reads it from the config)."""

    def to_arg(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_arg(cls, text: str) -> WorkerSpec:
        return cls(**json.loads(text))


def with_redis(config: GatewayConfig, url: str) -> GatewayConfig:
    """``config`` sharing state through ``url``. Only the running state gets it, never the config file's version:
    live edits are checked against the file's settings, and the private Redis lives as long as the parent."""
    state = StateConfig.model_validate({**config.state.model_dump(), "redis_url": url})
    return config.model_copy(update={"state": state})


@dataclass
class _Worker:
    index: int
    popen: subprocess.Popen[bytes]
    ready_read: int | None
    started: float
    ready: bool = False


class Workers:
    """Starts, restarts and stops the worker processes; ``command`` is the ``spillgate serve`` command line each
    runs, to which ``--worker-of`` is added."""

    def __init__(
        self,
        count: int,
        listener: socket.socket,
        command: Sequence[str],
        *,
        replica_urls: dict[str, list[str]],
        hosted_urls: dict[str, str],
        redis_url: str | None,
    ) -> None:
        self._count = count
        self._listener = listener
        self._command = list(command)
        self._replica_urls = replica_urls
        self._hosted_urls = hosted_urls
        self._redis_url = redis_url
        self._workers: list[_Worker] = []
        self._signals = 0
        self._backoff: dict[int, float] = {}

    @property
    def pids(self) -> list[int]:
        return [w.popen.pid for w in self._workers]

    def catch_signals(self) -> None:
        """From now on SIGTERM and SIGINT are counted, for :meth:`supervise` to act on."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, _signum: int, _frame: object) -> None:
        self._signals += 1

    def spawn(self) -> None:
        """Start every worker (:meth:`wait_serving` waits for them)."""
        self._workers = [self._spawn(index) for index in range(self._count)]

    def wait_serving(self) -> int | None:
        """Wait until every worker serves; None then, else the exit code of the one that failed (every other is
        stopped), or 0 when a stop signal came first."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(w.ready for w in self._workers):
            if self._signals:
                self.stop(drain_s=0)
                return 0
            for worker in self._workers:
                self._note_ready(worker)
                code = worker.popen.poll()
                if code is not None and not worker.ready:
                    print(f"spillgate: worker {worker.index} exited with code {code} while starting", file=sys.stderr)
                    self.stop(drain_s=0)
                    return code or 1
            if time.monotonic() > deadline:
                print(f"spillgate: workers not serving after {START_TIMEOUT_S:g} s", file=sys.stderr)
                self.stop(drain_s=0)
                return 1
            self._wait_readiness(0.1)
        return None

    def supervise(self, drain_s: float) -> int:
        """Until a stop signal: restart any worker that exits. Then stop them all (see :meth:`stop`)."""
        while not self._signals:
            self._wait_readiness(0.2)
            for position, worker in enumerate(self._workers):
                self._note_ready(worker)
                code = worker.popen.poll()
                if code is None or self._signals:
                    continue
                self._close_ready(worker)
                lived = time.monotonic() - worker.started
                delay = self._restart_delay(worker.index, lived)
                print(
                    f"spillgate: worker {worker.index} (pid {worker.popen.pid}) exited with code {code} after "
                    f"{lived:.1f} s; restarting it{f' in {delay:g} s' if delay else ''}",
                    file=sys.stderr,
                    flush=True,
                )
                if delay:
                    self._sleep_unless_signalled(delay)
                    if self._signals:
                        break
                self._workers[position] = self._spawn(worker.index)
        self.stop(drain_s)
        return 0

    def stop(self, drain_s: float) -> None:
        """SIGTERM every worker (each drains, up to ``drain_s``), a second one for each further signal (they cut
        what is left at once), and SIGKILL those still running ``STOP_MARGIN_S`` after the deadline."""
        with contextlib.suppress(OSError):
            self._listener.close()  # the workers hold their own copies until they have drained
        seen = self._signals
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + drain_s + STOP_MARGIN_S
        while any(w.popen.poll() is None for w in self._workers) and time.monotonic() < deadline:
            time.sleep(0.05)
            if self._signals > seen:
                seen = self._signals
                self._signal_all(signal.SIGTERM)
        for worker in self._workers:
            if worker.popen.poll() is None:
                print(f"spillgate: worker {worker.index} did not stop in time; killing it", file=sys.stderr)
                worker.popen.kill()
            worker.popen.wait()
            self._close_ready(worker)

    def _spawn(self, index: int) -> _Worker:
        ready_read, ready_write = os.pipe()
        spec = WorkerSpec(
            socket_fd=self._listener.fileno(),
            ready_fd=ready_write,
            index=index,
            replica_urls=self._replica_urls,
            hosted_urls=self._hosted_urls,
            redis_url=self._redis_url,
        )
        try:
            popen = subprocess.Popen(
                [*self._command, "--worker-of", spec.to_arg()],
                pass_fds=(self._listener.fileno(), ready_write),
                start_new_session=True,  # a terminal's Ctrl-C reaches the parent only, which forwards it once
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        finally:
            os.close(ready_write)
        return _Worker(index, popen, ready_read, time.monotonic())

    def _restart_delay(self, index: int, lived: float) -> float:
        """No wait after a worker that served a while; doubling (1 s up to 30 s) while one keeps dying young."""
        if lived >= _SHORT_LIFE_S:
            self._backoff.pop(index, None)
            return 0.0
        delay = min(_MAX_BACKOFF_S, self._backoff.get(index, 0.5) * 2)
        self._backoff[index] = delay
        return delay

    def _wait_readiness(self, timeout_s: float) -> None:
        pending = [w.ready_read for w in self._workers if w.ready_read is not None and not w.ready]
        if not pending:
            time.sleep(timeout_s)
            return
        with contextlib.suppress(InterruptedError):
            select.select(pending, [], [], timeout_s)

    def _note_ready(self, worker: _Worker) -> None:
        if worker.ready or worker.ready_read is None:
            return
        readable, _, _ = select.select([worker.ready_read], [], [], 0)
        if readable:
            worker.ready = os.read(worker.ready_read, 1) == b"1"
            self._close_ready(worker)

    @staticmethod
    def _close_ready(worker: _Worker) -> None:
        if worker.ready_read is not None:
            os.close(worker.ready_read)
            worker.ready_read = None

    def _signal_all(self, signum: int) -> None:
        for worker in self._workers:
            if worker.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.popen.pid, signum)

    def _sleep_unless_signalled(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._signals and time.monotonic() < deadline:
            time.sleep(0.05)
