"""Data parallelism as the engines run it: SGLang's ``--dp-size N`` (vLLM's ``--data-parallel-size N``) puts N
schedulers behind one HTTP server, each with its own KV cache and radix tree, its own compute and its own
KV-event publisher: rank r publishes on the configured port + r (the replay socket likewise) and stamps its
batches with r (SGLang's ``attn_dp_rank``, vLLM's ``data_parallel_rank``).

A request goes to the rank it names, else to the engine's default choice:

- SGLang (``managers/data_parallel_controller.py``): the ``X-Data-Parallel-Rank`` header, else ``routed_dp_rank``
  or its older name ``data_parallel_rank`` in the body (``entrypoints/openai/serving_base.py``,
  ``protocol.py``); without one, ``round_robin`` (what ``load_balance_method`` ``auto`` resolves to outside
  prefill-decode disaggregation). A header that is not an integer is refused (400), as is a rank that does not
  exist (both as SGLang 0.5.23 answered on this project's CPU tier).
- vLLM (``entrypoints/generate/base/serving.py``, ``v1/engine/core_client.py``): the ``X-data-parallel-rank``
  header only (one that is not an integer is ignored); without it, the engine with the fewest requests waiting
  and running, the scan starting one engine further each time so that ties take turns. A rank out of range is
  refused (``input_processor.py``).

Here the ranks share one process and one simulated clock, each running its own forward passes; ``/metrics``
shows their figures summed (the engines label each rank's series with ``dp_rank``), ``/sim/radix_cache`` and
``/sim/passes`` show rank 0, and ``/sim/dp_ranks`` shows each rank.
"""

from __future__ import annotations

import asyncio
import weakref
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, FastAPI, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from spillgate.backends.sim.clock import VirtualClock
from spillgate.backends.sim.errors import error_body
from spillgate.backends.sim.kv_events import KvEventPublisher
from spillgate.backends.sim.scheduler import Scheduler, SchedulerStats
from spillgate.backends.sim.wire import OrjsonResponse

if TYPE_CHECKING:
    from spillgate.backends.sim.config import ReplicaConfig
    from spillgate.backends.sim.pass_counters import PassCounters
    from spillgate.backends.sim.radix_cache import RadixCache
    from spillgate.backends.sim.request import SimRequest

REQUESTED_RANK: ContextVar[int | None] = ContextVar("sim_requested_dp_rank", default=None)
"""The rank the request being handled names (set by :class:`RankFromRequest`), None when it names none."""

_BODY_FIELDS = ("routed_dp_rank", "data_parallel_rank")
"""SGLang's body fields naming a rank, the newer first (it wins when both are set)."""


class DataParallelScheduler:
    """N schedulers behind one front end, used where one :class:`~backends.sim.scheduler.Scheduler` would be."""

    def __init__(self, config: ReplicaConfig, clock: VirtualClock, publishers: list[KvEventPublisher | None]) -> None:
        limits = config.scheduler_limits()
        self.ranks = [Scheduler(config.preset_spec, limits, clock, publisher) for publisher in publishers]
        self.clock = clock
        self.limits = limits
        self.preset = config.preset_spec
        self._least_loaded = config.engine == "vllm"
        self._turn = 0
        self._where: weakref.WeakKeyDictionary[SimRequest, Scheduler] = weakref.WeakKeyDictionary()
        self.routed = [0] * len(self.ranks)
        """Requests each rank was given, for ``/sim/dp_ranks``."""

    # what the routes and the debug pages read: rank 0 where one rank must answer -----------------------------

    @property
    def cache(self) -> RadixCache:
        return self.ranks[0].cache

    @property
    def passes(self) -> PassCounters:
        return self.ranks[0].passes

    # lifecycle ------------------------------------------------------------------------------------------------

    def start(self) -> None:
        for rank in self.ranks:
            rank.start()

    async def stop(self) -> None:
        for rank in self.ranks:
            await rank.stop()

    def now(self) -> float:
        return max(rank.now() for rank in self.ranks)

    # requests -------------------------------------------------------------------------------------------------

    def submit(self, req: SimRequest) -> None:
        rank = REQUESTED_RANK.get()
        if rank is None:
            rank = self._least_loaded_rank() if self._least_loaded else self._round_robin()
        elif not 0 <= rank < len(self.ranks):
            raise ValueError(f"routed_dp_rank={rank} out of range [0, {len(self.ranks)})")
        scheduler = self.ranks[rank]
        self._where[req] = scheduler
        self.routed[rank] += 1
        scheduler.submit(req)

    def abort(self, req: SimRequest) -> None:
        scheduler = self._where.get(req)
        if scheduler is not None:
            scheduler.abort(req)

    def abort_all(self) -> None:
        for rank in self.ranks:
            rank.abort_all()

    async def flush_cache(self, timeout: float = 0.0) -> bool:
        """Every rank is asked (SGLang's controller sends the flush to each); it succeeded if each did."""
        flushed = await asyncio.gather(*(rank.flush_cache(timeout) for rank in self.ranks))
        return all(flushed)

    def stats(self) -> SchedulerStats:
        """The ranks' figures summed; the token usage over all their KV, the hit rate their mean."""
        each = [rank.stats() for rank in self.ranks]
        total_kv = self.limits.max_total_num_tokens * len(each)
        used = sum(s.num_used_tokens for s in each)
        return SchedulerStats(
            num_running_reqs=sum(s.num_running_reqs for s in each),
            num_queue_reqs=sum(s.num_queue_reqs for s in each),
            num_used_tokens=used,
            kv_available_tokens=sum(s.kv_available_tokens for s in each),
            kv_evictable_tokens=sum(s.kv_evictable_tokens for s in each),
            token_usage=used / total_kv,
            cache_hit_rate=sum(s.cache_hit_rate for s in each) / len(each),
            gen_throughput=sum(s.gen_throughput for s in each),
            decode_sum_seq_lens=sum(s.decode_sum_seq_lens for s in each),
            num_waiting_uncached_tokens=sum(s.num_waiting_uncached_tokens for s in each),
            num_retracted_reqs=sum(s.num_retracted_reqs for s in each),
        )

    def _round_robin(self) -> int:
        rank = self._turn % len(self.ranks)
        self._turn = rank + 1
        return rank

    def _least_loaded_rank(self) -> int:
        count = len(self.ranks)
        start, self._turn = self._turn % count, self._turn + 1
        order = [(start + offset) % count for offset in range(count)]
        return min(order, key=lambda rank: _requests(self.ranks[rank].stats()))


def _requests(stats: SchedulerStats) -> int:
    return stats.num_running_reqs + stats.num_queue_reqs


class PublisherGroup:
    """Every rank's KV-event publisher, opened and closed together where one publisher would be."""

    def __init__(self, publishers: list[KvEventPublisher]) -> None:
        self.publishers = publishers

    @property
    def next_seq(self) -> int:
        """Rank 0's (``/sim/radix_cache`` shows rank 0's cache)."""
        return self.publishers[0].next_seq

    async def start(self) -> None:
        for publisher in self.publishers:
            await publisher.start()

    async def close(self) -> None:
        for publisher in self.publishers:
            await publisher.close()


def data_parallel_ranks(
    config: ReplicaConfig, clock: VirtualClock
) -> tuple[DataParallelScheduler, PublisherGroup | None]:
    """The schedulers of ``config.dp_size`` ranks and, with ``--kv-events-config``, their publishers."""
    events = config.kv_events
    if events is not None and events.publishes:
        publishers = [KvEventPublisher(events, config.page_size, rank) for rank in range(config.dp_size)]
        return DataParallelScheduler(config, clock, list(publishers)), PublisherGroup(publishers)
    return DataParallelScheduler(config, clock, [None] * config.dp_size), None


# the rank a request names ---------------------------------------------------------------------------------------


class _Refused(ValueError):
    """A rank the server refuses; ``kind`` is the error's ``type`` in SGLang's body."""

    def __init__(self, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.kind = kind


class RankFromRequest:
    """Reads the rank a POST names (the header; for SGLang also the body) into :data:`REQUESTED_RANK` for the
    scheduler, and refuses one that is not an integer or names no rank. Plain ASGI: the body is read once and
    handed on as it came."""

    def __init__(self, app: ASGIApp, ranks: int, sglang: bool) -> None:
        self._app = app
        self._ranks = ranks
        self._sglang = sglang

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT"):
            await self._app(scope, receive, send)
            return
        messages: list[Message] = []
        body = b""
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        try:
            rank = self._requested(dict(scope["headers"]).get(b"x-data-parallel-rank"), body)
        except _Refused as exc:
            await _refuse(exc, self._sglang, scope, send)
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        token = REQUESTED_RANK.set(rank)
        try:
            await self._app(scope, replay, send)
        finally:
            REQUESTED_RANK.reset(token)

    def _requested(self, header: bytes | None, body: bytes) -> int | None:
        rank = None
        if header is not None:
            try:
                rank = int(header)
            except ValueError:
                if self._sglang:  # an HTTPException: its status as the type
                    got = header.decode("latin-1")
                    message = f"Invalid X-Data-Parallel-Rank header: must be an integer, got '{got}'"
                    raise _Refused(message, "400") from None
        elif self._sglang and b"_rank" in body:
            rank = _body_rank(body)
        if rank is not None and not 0 <= rank < self._ranks:
            if self._sglang:
                raise _Refused(f"routed_dp_rank={rank} out of range [0, {self._ranks})")
            raise _Refused(f"data_parallel_rank {rank} is out of range [0, {self._ranks}).")
        return rank


def _body_rank(body: bytes) -> int | None:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None  # the route refuses it in its own words
    if not isinstance(payload, dict):
        return None
    for name in _BODY_FIELDS:
        value = payload.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


async def _refuse(refused: _Refused, sglang: bool, scope: Scope, send: Send) -> None:
    if sglang:
        body: dict[str, Any] = error_body(str(refused), refused.kind)
    else:
        body = {"error": {"message": str(refused), "type": "BadRequestError", "param": None, "code": 400}}

    async def nothing() -> Message:
        return {"type": "http.disconnect"}

    await OrjsonResponse(body, status_code=400)(scope, nothing, send)


# introspection --------------------------------------------------------------------------------------------------

router = APIRouter()


@router.get("/sim/dp_ranks")
async def dp_ranks(request: Request) -> OrjsonResponse:
    """Per rank: the requests it was given, the tokens its cache holds and the KV-event batches it published."""
    replica = request.app.state.replica
    scheduler: DataParallelScheduler = replica.scheduler
    publishers = replica.kv_events.publishers if replica.kv_events is not None else [None] * len(scheduler.ranks)
    return OrjsonResponse(
        [
            {
                "rank": index,
                "requests": scheduler.routed[index],
                "cached_tokens": rank.cache.total_size,
                "kv_events_next_seq": publisher.next_seq if publisher is not None else None,
            }
            for index, (rank, publisher) in enumerate(zip(scheduler.ranks, publishers, strict=True))
        ]
    )


def install_data_parallel(app: FastAPI, config: ReplicaConfig) -> None:
    """With more than one rank: read the rank each request names, and serve ``/sim/dp_ranks``."""
    if config.dp_size > 1:
        app.add_middleware(RankFromRequest, ranks=config.dp_size, sglang=config.engine != "vllm")
        app.include_router(router)
