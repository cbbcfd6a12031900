"""What the gateway needs to know about an inference engine, whichever engine it is.

A pool names its engine (``engine: sglang | vllm | openai``, or any other that registered itself with
:func:`register_engine`); everything engine-specific (which endpoint says the process is alive, where its limits
and load are published and under which names, which request fields the gateway owns, the shape of its errors)
lives in one module per engine behind :class:`Engine`. The registry and the proxy ask the engine; they never
test which one it is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import httpx

Get = Callable[[str], Awaitable[httpx.Response]]
"""``GET base_url + path`` on one replica, with its key and the probe timeout."""


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """The scheduler figures an engine exports, summed over data-parallel ranks."""

    running: int = 0
    queued: int = 0
    token_usage: float = 0.0
    cache_hit_rate: float = 0.0
    prompt_tokens_total: float = 0.0
    """A counter that only grows while the process lives: when it goes down, the replica restarted."""


@dataclass(frozen=True, slots=True)
class KvEventSource:
    """Where a replica publishes its KV-cache events. A host of ``*`` (or ``0.0.0.0``, ``::``, empty) means the
    replica binds on every interface: the gateway reaches it at the replica's own host.

    A data-parallel replica (SGLang's ``--dp-size``, vLLM's ``--data-parallel-size``) runs one scheduler, and
    keeps one KV cache, per rank; rank r publishes on the endpoint's port + r, its replay socket likewise (both
    engines' ``offset_endpoint_port``): :meth:`rank`."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    ranks: int | None = None
    """Data-parallel ranks publishing; None where the config gives the endpoint and the replica's own report
    says how many (:func:`with_ranks`)."""

    def at_host(self, host: str) -> KvEventSource:
        return KvEventSource(
            endpoint=_with_host(self.endpoint, host),
            replay_endpoint=None if self.replay_endpoint is None else _with_host(self.replay_endpoint, host),
            topic=self.topic,
            ranks=self.ranks,
        )

    def rank(self, rank: int) -> KvEventSource:
        """Where data-parallel rank ``rank`` publishes."""
        if rank == 0:
            return self
        replay = self.replay_endpoint
        return KvEventSource(
            endpoint=offset_port(self.endpoint, rank),
            replay_endpoint=None if replay is None else offset_port(replay, rank),
            topic=self.topic,
            ranks=self.ranks,
        )


def offset_port(endpoint: str, rank: int) -> str:
    """``tcp://host:port`` with the port moved up by ``rank``, as the engines place their ranks' sockets."""
    address, _, port = endpoint.rpartition(":")
    return f"{address}:{int(port) + rank}"


def with_ranks(source: KvEventSource, reported: KvEventSource | None) -> KvEventSource:
    """``source`` with its rank count settled: its own, else the one the replica reported, else 1."""
    if source.ranks is not None:
        return source
    ranks = reported.ranks if reported is not None and reported.ranks else 1
    return replace(source, ranks=ranks)


_ANY_HOST = ("*", "0.0.0.0", "::", "[::]", "")


def _with_host(endpoint: str, host: str) -> str:
    scheme, _, rest = endpoint.partition("://")
    address, _, port = rest.rpartition(":")
    if scheme == "tcp" and address in _ANY_HOST:
        return f"tcp://{host}:{port}"
    return endpoint


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """What a replica says about itself when it registers (again after a restart); 0 or None when it does not."""

    max_total_tokens: int = 0
    """Tokens its KV cache holds."""
    max_running: int = 0
    """Requests it runs at once: the effective limit, not only an explicit flag."""
    prefill_batch_tokens: int = 0
    """New tokens one prefill batch takes (SGLang's ``chunked_prefill_size``)."""
    context_window: int = 0
    """Largest prompt plus output it accepts (``max_model_len``)."""
    overlap_schedule: bool = False
    """It forms the next batch before the last one's results are processed (SGLang's default scheduler)."""
    metrics: bool = False
    """It serves Prometheus ``/metrics`` with its scheduler's load."""
    cache_report: bool | None = None
    """It reports ``usage.prompt_tokens_details.cached_tokens``; None until a response shows whether it does."""
    version: str = ""
    kv_events: KvEventSource | None = None
    """Where it publishes KV-cache events, as it reports (SGLang's ``/server_info``, vLLM's ``/kv_event_sources``)."""
    missing: tuple[str, ...] = ()
    """Features the gateway uses that this replica has switched off, each naming the flag that switches it on."""

    def capabilities(self) -> dict[str, Any]:
        """For ``/health``: what the gateway reads from this replica, and what it lacks."""
        return {
            "version": self.version or None,
            "metrics": self.metrics,
            "cache_report": self.cache_report,
            "overlap_schedule": self.overlap_schedule,
            "max_running": self.max_running or None,
            "max_total_tokens": self.max_total_tokens or None,
            "chunked_prefill_size": self.prefill_batch_tokens or None,
            "context_window": self.context_window or None,
            "kv_events": None if self.kv_events is None else self.kv_events.endpoint,
            "dp_size": None if self.kv_events is None else self.kv_events.ranks,
        }


class Engine(ABC):
    """One engine's protocol, as the gateway uses it. Stateless: one instance serves every replica."""

    name: ClassVar[str]
    liveness_path: ClassVar[str]
    """Answered by the server process itself, at once, even while the model is busy: whether it is alive."""
    generation_check: ClassVar[tuple[str, float] | None] = None
    """A deeper check that runs a generation (path, seconds it may take), run now and then in the background:
    it catches a process that answers but whose scheduler is stuck."""
    metrics_path: ClassVar[str | None] = "/metrics"
    owned_fields: ClassVar[tuple[str, ...]] = ()
    """Request fields a client must not set: the gateway owns them, or they reach beyond the request."""
    cache_report_flag: ClassVar[str | None] = None
    """The server flag that makes it report ``cached_tokens``, for the log and ``/health``."""
    dp_rank_field: ClassVar[str | None] = None
    """The body field that sends a request to one data-parallel rank of the replica (an owned field)."""
    dp_rank_header: ClassVar[bytes | None] = None
    """The header that does, for an engine that takes it there instead."""

    def to_rank(self, payload: dict[str, Any], rank: int) -> tuple[tuple[bytes, bytes], ...]:
        """Send ``payload`` to data-parallel rank ``rank``: sets the body field, or returns the header to add."""
        if self.dp_rank_field is not None:
            payload[self.dp_rank_field] = rank
        if self.dp_rank_header is not None:
            return ((self.dp_rank_header, str(rank).encode()),)
        return ()

    @abstractmethod
    def parse_load(self, text: str) -> ReplicaLoad:
        """The load figures in a ``/metrics`` page; absent metrics read as zero."""

    @abstractmethod
    async def describe(self, get: Get, served_model: str) -> ReplicaInfo:
        """Ask the replica for its limits and what it has switched on."""

    def error_message(self, body: object) -> tuple[str, str | None] | None:
        """The message (and the parameter it names) of an error body in this engine's shape, if it has one."""
        return openai_error_message(body)

    def template_messages(self, payload: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
        """A chat request's messages as this engine hands them to the model's chat template: the prefix index
        renders the same, so that its blocks are the ones the engine caches. As sent, unless an engine says."""
        return payload["messages"]


_ENGINES: dict[str, Engine] = {}


def register_engine(engine: Engine) -> Engine:
    """Make ``engine`` nameable by a pool's ``engine:``; each engine's module calls this once. Refuses another
    engine under a taken name, so a plug-in cannot silently replace a built-in one."""
    known = _ENGINES.get(engine.name)
    if known is not None and type(known) is not type(engine):
        raise ValueError(f"engine {engine.name!r} is already registered")
    _ENGINES[engine.name] = engine
    return engine


def engine_named(name: str) -> Engine:
    """The engine registered as ``name``; ``KeyError`` when none is."""
    return _ENGINES[name]


def engine_names() -> tuple[str, ...]:
    """Every registered engine's name, in registration order."""
    return tuple(_ENGINES)


def openai_error_message(body: object) -> tuple[str, str | None] | None:
    """``{"error": {"message", "param"}}`` (OpenAI's shape, vLLM's too) or ``{"error": "text"}`` (auth refusals)."""
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    if isinstance(error, str) and error:
        return error, None
    if isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"]:
        param = error.get("param")
        return error["message"], param if isinstance(param, str) else None
    return None


def as_int(value: object) -> int:
    """An integer field of a server's JSON, or 0 when it is absent, null or not a number."""
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0


async def model_context_window(get: Get, served_model: str) -> int:
    """``max_model_len`` of the served model from ``/v1/models`` (SGLang and vLLM both list it); 0 if absent."""
    response = await get("/v1/models")
    if response.status_code != 200:
        return 0
    cards = response.json().get("data")
    if not isinstance(cards, list):
        return 0
    lengths = [c.get("max_model_len") for c in cards if isinstance(c, Mapping)]
    named = [c.get("max_model_len") for c in cards if isinstance(c, Mapping) and c.get("id") == served_model]
    for length in named or lengths:
        if isinstance(length, int) and length > 0:
            return length
    return 0
