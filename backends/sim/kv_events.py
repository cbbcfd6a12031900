"""KV-cache events as SGLang 0.5.23 and vLLM 0.32 publish them: ``--kv-events-config``, the ZMQ PUB socket, the
sequence counter, the replay buffer and its ROUTER socket, and the hash chains that name cached blocks.

The radix cache tells the publisher what it stores (:meth:`KvEventPublisher.stored`), evicts
(:meth:`KvEventPublisher.removed`) and drops (:meth:`KvEventPublisher.cleared`); the scheduler calls
:meth:`KvEventPublisher.flush` after each forward pass, which sends what was recorded as one batch. Without the flag
none of this exists: the cache holds no publisher and hashes nothing.

Wire format (both engines): a message is ``[topic, seq (8 bytes, big-endian), msgpack([ts, events, dp_rank])]``;
each event is a map tagged by ``"type"``. ``seq`` counts batches from 0 per process. A DEALER that sends
``[b"", start_seq]`` to the replay endpoint gets ``[b"", topic, seq, payload]`` for every retained batch from
``start_seq`` on, then ``[b"", b"", -1 (signed), b""]``.

SGLang names a page by a SHA-256 chain (``mem_cache/utils.py: get_hash_str``): the parent page's digest, then the
page's tokens as u32 little-endian; a salted chain starts from ``sha256(b"sglang-cache-salt-v1\\0" + salt)``; the
published value is the digest's first 8 bytes as a signed big-endian int64. vLLM's hash is its own (any chained hash
serves a subscriber); here SHA-256 over the parent digest, the tokens and, for the first block, the cache salt, its
last 8 bytes published as an unsigned int64.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import sys
import time
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import zmq
import zmq.asyncio
from pydantic import BaseModel, ConfigDict, Field, ValidationError

logger = logging.getLogger("spillgate.sim.kv_events")

MEDIUM_GPU = "GPU"
SGLANG_SALT_SEED = b"sglang-cache-salt-v1\0"
VLLM_CHAIN_SEED = b"spillgate-sim-vllm-block-v1\0"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
NAMESPACE_SEPARATOR = "\x1f"
"""``engine.cache_namespace`` joins ``extra_key`` and ``cache_salt`` with it."""


def split_namespace(namespace: str | None) -> tuple[str | None, str | None]:
    """``(extra_key, cache_salt)`` of a radix-cache namespace (``engine.cache_namespace``'s inverse)."""
    if namespace is None:
        return None, None
    extra_key, _, cache_salt = namespace.partition(NAMESPACE_SEPARATOR)
    return extra_key or None, cache_salt or None


# --kv-events-config ---------------------------------------------------------------------------------------------


class _SglangFlag(BaseModel):
    """SGLang's ``KVEventsConfig`` (``disaggregation/kv_events.py``): unknown keys are ignored."""

    model_config = ConfigDict(extra="ignore")

    publisher: Literal["null", "zmq"] = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = Field(default=10_000, ge=0)
    hwm: int = Field(default=100_000, ge=0)
    max_queue_size: int = 100_000
    topic: str = ""
    bind: bool = False


class _VllmFlag(BaseModel):
    """vLLM's ``KVEventsConfig`` (``config/kv_events.py``): unknown keys are refused; the publisher defaults to
    ``zmq`` when events are enabled."""

    model_config = ConfigDict(extra="forbid")

    enable_kv_cache_events: bool = False
    publisher: Literal["null", "zmq"] | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = Field(default=10_000, ge=0)
    hwm: int = Field(default=100_000, ge=0)
    max_queue_size: int = 100_000
    topic: str = ""


@dataclass(frozen=True)
class KvEventsConfig:
    """A parsed ``--kv-events-config``: where to publish, and what each engine shows of it."""

    engine: str
    raw: str
    publisher: str
    endpoint: str
    replay_endpoint: str | None
    buffer_steps: int
    hwm: int
    max_queue_size: int
    topic: str
    bind: bool
    """Listen on ``endpoint`` (else connect to a subscriber listening there)."""
    fields: dict[str, Any]
    """Every key as the engine holds it (vLLM's ``/kv_event_sources``)."""
    dp_size: int = 1
    """Data-parallel ranks publishing: rank r on ``endpoint``'s port + r (:meth:`for_rank`)."""

    @property
    def publishes(self) -> bool:
        if self.engine == "vllm":
            return self.publisher == "zmq" and bool(self.fields["enable_kv_cache_events"])
        return self.publisher == "zmq"

    def server_info(self, block_size: int) -> dict[str, Any] | None:
        """SGLang's ``/server_info`` ``kv_events`` block (null when nothing is published)."""
        if not self.publishes:
            return None
        host, port = endpoint_host_port(self.endpoint)
        info: dict[str, Any] = {
            "publisher": self.publisher,
            "endpoint_host": host,
            "endpoint_port_base": port,
            "topic": self.topic,
            "block_size": block_size,
            "dp_size": self.dp_size,
        }
        if self.replay_endpoint is not None:
            info["replay_endpoint_port_base"] = endpoint_host_port(self.replay_endpoint)[1]
        return info

    def sources(self) -> dict[str, Any]:
        """vLLM's ``/kv_event_sources``: the config per data-parallel rank, each with its own ports (``{}`` when
        nothing is published)."""
        if not self.publishes:
            return {}
        return {str(rank): dict(self.for_rank(rank).fields) for rank in range(self.dp_size)}

    def for_rank(self, rank: int) -> KvEventsConfig:
        """Where data-parallel rank ``rank`` publishes: both engines add the rank to the ports
        (``offset_endpoint_port``)."""
        if rank == 0:
            return self
        endpoint = offset_endpoint_port(self.endpoint, rank)
        replay = None if self.replay_endpoint is None else offset_endpoint_port(self.replay_endpoint, rank)
        fields = {**self.fields, "endpoint": endpoint, "replay_endpoint": replay}
        return dataclasses.replace(self, endpoint=endpoint, replay_endpoint=replay, fields=fields)


def offset_endpoint_port(endpoint: str, rank: int) -> str:
    """The engines' ``offset_endpoint_port``: a TCP port moves up by ``rank``, an ``inproc://`` name gets
    ``_dp{rank}``; anything else cannot be offset (ValueError, as the engines raise)."""
    if rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{rank}"
    if endpoint.startswith("tcp://"):
        address, _, port = endpoint.rpartition(":")
        return f"{address}:{int(port) + rank}"
    raise ValueError(f"cannot publish data-parallel rank {rank} on {endpoint!r}: must contain 'inproc' or 'tcp'")


def endpoint_host_port(endpoint: str) -> tuple[str | None, int | None]:
    """Host and port of ``tcp://HOST:PORT`` (``[::]`` style hosts lose their brackets); ``(None, None)`` for
    ``ipc://`` and ``inproc://``."""
    if not endpoint.startswith("tcp://"):
        return None, None
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    return host.strip("[]"), int(port)


def _check_endpoint(endpoint: str, name: str) -> None:
    if endpoint.startswith(("ipc://", "inproc://")):
        return
    if not endpoint.startswith("tcp://"):
        raise ValueError(f"{name} must be tcp://HOST:PORT, ipc://PATH or inproc://NAME, got {endpoint!r}")
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{name} must be tcp://HOST:PORT with a port in 1-65535, got {endpoint!r}")


def _binds(engine: str, endpoint: str, bind: bool) -> bool:
    """SGLang binds when told to or on a wildcard host; vLLM binds on a wildcard host or a local socket file."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    host = endpoint_host_port(endpoint)[0]
    if engine == "sglang":
        return bind or host in ("*", "0.0.0.0")
    return host in ("*", "::", "0.0.0.0")


def parse_kv_events_config(engine: str, text: str | None, dp_size: int = 1) -> KvEventsConfig | None:
    """The flag as ``engine`` reads it, for ``dp_size`` data-parallel ranks; ValueError (with a message naming the
    problem) if it is not valid."""
    if text is None:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc}): {text!r}") from None
    if not isinstance(data, dict):
        raise ValueError(f"must be a JSON object, got {text!r}")
    try:
        flag: _SglangFlag | _VllmFlag = (_VllmFlag if engine == "vllm" else _SglangFlag).model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors())
        raise ValueError(problems) from None
    _check_endpoint(flag.endpoint, "endpoint")
    if flag.replay_endpoint is not None:
        _check_endpoint(flag.replay_endpoint, "replay_endpoint")
    if isinstance(flag, _VllmFlag):
        publisher = flag.publisher or ("zmq" if flag.enable_kv_cache_events else "null")
        fields = {**flag.model_dump(), "publisher": publisher}
        bind = _binds(engine, flag.endpoint, False)
    else:
        publisher = flag.publisher
        fields = flag.model_dump()
        bind = _binds(engine, flag.endpoint, flag.bind)
    config = KvEventsConfig(
        engine=engine,
        raw=text,
        publisher=publisher,
        endpoint=flag.endpoint,
        replay_endpoint=flag.replay_endpoint,
        buffer_steps=flag.buffer_steps,
        hwm=flag.hwm,
        max_queue_size=flag.max_queue_size,
        topic=flag.topic,
        bind=bind,
        fields=fields,
        dp_size=dp_size,
    )
    for rank in range(1, dp_size):
        config.for_rank(rank)  # every rank's endpoints can be offset, or the start stops here
    return config


# events on the wire ---------------------------------------------------------------------------------------------


class _Event(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """Tagged maps (``{"type": ..., ...}``); defaults are left out, as both engines encode them."""


class SglangBlockStored(_Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None


class SglangBlockRemoved(_Event, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class VllmBlockStored(_Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class VllmBlockRemoved(_Event, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(_Event, tag="AllBlocksCleared"):
    pass


class EventBatch(msgspec.Struct, array_like=True, gc=False):
    """``[ts, events, dp_rank]``."""

    ts: float
    events: list[Any]
    data_parallel_rank: int


# hash chains ----------------------------------------------------------------------------------------------------


def _token_bytes(tokens: Sequence[int]) -> bytes:
    packed = array("I", tokens)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def sglang_page_digests(parent: bytes | None, tokens: Sequence[int], page_size: int) -> list[bytes]:
    """SGLang's chain over whole pages of ``tokens`` from ``parent`` (a digest, the salt seed, or None at the root)."""
    raw = _token_bytes(tokens)
    step = 4 * page_size
    digests = []
    for start in range(0, len(raw) - step + 1, step):
        parent = hashlib.sha256(raw[start : start + step] if parent is None else parent + raw[start : start + step])
        parent = parent.digest()
        digests.append(parent)
    return digests


def sglang_salt_seed(cache_salt: str) -> bytes:
    return hashlib.sha256(SGLANG_SALT_SEED + cache_salt.encode("utf-8")).digest()


def sglang_published(digest: bytes) -> int:
    """The int64 SGLang publishes for a page: the digest's first 8 bytes, big-endian, signed."""
    return int.from_bytes(digest[:8], "big", signed=True)


def vllm_block_digests(
    parent: bytes | None, tokens: Sequence[int], block_size: int, cache_salt: str | None
) -> list[bytes]:
    """The simulator's vLLM chain: the first block hashes a seed carrying the salt (vLLM's extra keys)."""
    if parent is None:
        salt = b"\1" + cache_salt.encode("utf-8") if cache_salt is not None else b"\0"
        parent = hashlib.sha256(VLLM_CHAIN_SEED + salt).digest()
    return sglang_page_digests(parent, tokens, block_size)


def vllm_published(digest: bytes) -> int:
    """The unsigned 64-bit block hash: the digest's last 8 bytes."""
    return int.from_bytes(digest[-8:], "big")


# the publisher --------------------------------------------------------------------------------------------------


class KvEventPublisher:
    """Records the radix cache's changes, publishes them as batches, and answers replay requests.

    Never blocks the event loop: the PUB socket sends without waiting (a subscriber past the high-water mark misses
    messages, as with the real engines), and the replay socket is served by an asyncio task.
    """

    def __init__(self, config: KvEventsConfig, page_size: int, rank: int = 0) -> None:
        self.config = config.for_rank(rank)
        self.page_size = page_size
        self.rank = rank
        """The data-parallel rank whose cache this publishes, stamped on every batch."""
        self.vllm = config.engine == "vllm"
        self._topic = config.topic.encode("utf-8")
        self._pending: list[_Event] = []
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._encoder = msgspec.msgpack.Encoder()
        self._context: Any = None
        self._pub: Any = None
        self._router: Any = None
        self._replay_task: asyncio.Task[None] | None = None

    @property
    def next_seq(self) -> int:
        """The sequence number the next batch gets (so batches ``0 .. next_seq - 1`` were published)."""
        return self._seq

    def retained(self, start: int = 0) -> list[tuple[int, bytes]]:
        """The batches the replay buffer still holds from ``start`` on: ``(seq, payload)``."""
        return [(seq, payload) for seq, payload in self._buffer if seq >= start]

    # lifecycle --------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the sockets; SGLang then publishes the empty cache (``AllBlocksCleared``) as batch 0."""
        self._context = zmq.asyncio.Context()
        self._pub = zmq.Socket(self._context, zmq.PUB)  # a plain socket: sends never wait
        self._pub.setsockopt(zmq.SNDHWM, self.config.hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        if self.config.bind:
            self._pub.bind(self.config.endpoint)
        else:
            self._pub.connect(self.config.endpoint)
        if self.config.replay_endpoint is not None:
            self._router = self._context.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.bind(self.config.replay_endpoint)
            self._replay_task = asyncio.get_running_loop().create_task(self._serve_replay(), name="sim-kv-replay")
        if not self.vllm:
            self.cleared()
            self.flush()

    async def close(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
            self._replay_task = None
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._router = None
        if self._context is not None:
            self._context.destroy(linger=0)
            self._context = None

    # what the radix cache reports ----------------------------------------------------------------------------------

    def stored(self, parent: bytes | None, tokens: list[int], namespace: str | None) -> list[bytes]:
        """A new radix node holding ``tokens`` (whole pages) under the page whose digest is ``parent`` (None: the
        root); records its BlockStored and returns the node's page digests."""
        salt = split_namespace(namespace)[1]
        size = self.page_size
        if self.vllm:
            digests = vllm_block_digests(parent, tokens, size, salt)
            extra = [None] * len(digests)
            if parent is None and salt is not None and extra:
                extra[0] = (salt,)
            self._pending.append(
                VllmBlockStored(
                    block_hashes=[vllm_published(d) for d in digests],
                    parent_block_hash=None if parent is None else vllm_published(parent),
                    token_ids=list(tokens),
                    block_size=size,
                    lora_id=None,
                    medium=MEDIUM_GPU,
                    lora_name=None,
                    extra_keys=extra,
                    group_idx=0,
                    kv_cache_spec_kind="full_attention",
                )
            )
            return digests
        seed = parent if parent is not None else (sglang_salt_seed(salt) if salt is not None else None)
        digests = sglang_page_digests(seed, tokens, size)
        self._pending.append(
            SglangBlockStored(
                block_hashes=[sglang_published(d) for d in digests],
                parent_block_hash=None if parent is None else sglang_published(parent),
                token_ids=list(tokens),
                block_size=size,
                lora_id=None,
                medium=MEDIUM_GPU,
                cache_salt=salt,
            )
        )
        return digests

    def removed(self, digests: list[bytes]) -> None:
        """An evicted radix node: SGLang names all its pages in one event, vLLM each block in its own."""
        if self.vllm:
            for digest in reversed(digests):  # vLLM frees a request's blocks tail first
                self._pending.append(VllmBlockRemoved(block_hashes=[vllm_published(digest)], medium=MEDIUM_GPU))
        elif digests:
            self._pending.append(
                SglangBlockRemoved(block_hashes=[sglang_published(d) for d in digests], medium=MEDIUM_GPU)
            )

    def cleared(self) -> None:
        self._pending.append(AllBlocksCleared())

    # publishing -----------------------------------------------------------------------------------------------------

    def flush(self) -> None:
        """Send what was recorded since the last flush as one batch (nothing if nothing changed)."""
        if not self._pending:
            return
        events, self._pending = self._pending, []
        payload = self._encoder.encode(EventBatch(ts=time.time(), events=events, data_parallel_rank=self.rank))
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        if self._pub is None:
            return
        try:
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK)
        except zmq.Again:  # a PUB socket drops rather than blocks; kept for other socket types' sake
            logger.warning("KV event batch %d dropped: the publisher's queue is full", seq)

    async def _serve_replay(self) -> None:
        """``[identity..., b"", start_seq]`` in; every retained batch from ``start_seq`` on, then the end mark, out."""
        router = self._router
        while True:
            frames = await router.recv_multipart()
            if len(frames) < 3 or frames[-2] != b"" or len(frames[-1]) != 8:
                logger.warning("ignoring a malformed KV event replay request (%d frames)", len(frames))
                continue
            route = frames[:-1]  # the identities and the empty delimiter
            for seq, payload in self.retained(int.from_bytes(frames[-1], "big")):
                await router.send_multipart((*route, self._topic, seq.to_bytes(8, "big"), payload))
            await router.send_multipart((*route, b"", END_SEQ, b""))
