"""How a gateway process stops: uvicorn's server, with a drain (:mod:`gateway.serving.drain`) before its shutdown.

uvicorn on SIGTERM closes its socket at once and cuts whatever is still running after its graceful timeout. The
gateway instead keeps answering (``/ready`` 503, new completions 503 with ``retry-after``) while the completions
in flight finish, up to ``timeouts.drain_s``; then uvicorn shuts down as usual: its socket closes, idle
connections close, the lifespan stops the state (the ledger is flushed). A second signal cuts what is left at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from types import FrameType

import uvicorn

from spillgate.gateway.serving.drain import Drain

log = logging.getLogger("spillgate.gateway")


class GatewayServer(uvicorn.Server):
    """``drain_s`` is the config's ``timeouts.drain_s`` at start (timeouts change only with a restart);
    ``ready_fd``, when given, is written one byte and closed once the server serves (a supervising parent waits
    on it)."""

    def __init__(self, config: uvicorn.Config, drain: Drain, drain_s: float, ready_fd: int | None = None) -> None:
        super().__init__(config)
        self._drain = drain
        self._drain_s = drain_s
        self._ready_fd = ready_fd
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started and self._ready_fd is not None:
            os.write(self._ready_fd, b"1")
            os.close(self._ready_fd)
            self._ready_fd = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """A stop signal (run in the main thread, between two bytecodes): drain, unless not serving yet."""
        loop = self._loop
        if loop is None or not self.started or self.should_exit:
            super().handle_exit(sig, frame)
            return
        loop.call_soon_threadsafe(self._stop_requested)

    def _stop_requested(self) -> None:
        if self._draining is None:
            self._draining = asyncio.create_task(self._drain_then_exit(), name="spillgate-drain")
        else:
            log.warning("second stop signal: cutting what is still in flight now")
            self._drain.hurry()

    async def _drain_then_exit(self) -> None:
        try:
            await self._drain.run(self._drain_s)
        finally:
            self.should_exit = True
