"""The KV-cache events SGLang and vLLM publish, decoded into plain records.

Both engines send ZMQ messages of three frames: the topic, an 8-byte big-endian sequence number counted per
publisher from 0 (it starts again at 0 when the engine restarts), and a msgpack batch ``[ts, events, rank]``.
Recent versions (SGLang 0.5.20+, vLLM 0.32) encode each event as a map with a ``type`` key; older ones as a
tagged array with the fields in declaration order. Both are read here, so the subscriber need not know which
engine or version it listens to. Hashes are opaque keys: SGLang's are signed, vLLM's unsigned, and vLLM can be
told to send bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import xxhash

_DECODER = msgspec.msgpack.Decoder()

# Positions in the tagged-array encoding (the tag is element 0).
_ARRAY_STORED = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name")
_ARRAY_STORED_EXTRA_KEYS = 9  # vLLM: ..., medium, lora_name, extra_keys


class MalformedBatch(ValueError):
    """A message that is not a KV-event batch of either engine."""


@dataclass(frozen=True, slots=True)
class BlocksStored:
    """Consecutive blocks now cached: ``hashes[0]``'s parent is ``parent`` (None at the root)."""

    hashes: tuple[int, ...]
    parent: int | None
    token_ids: Sequence[int]
    block_size: int
    salt: str | None
    """The cache salt the blocks were stored under (SGLang's ``cache_salt``, vLLM's first block's extra key)."""


@dataclass(frozen=True, slots=True)
class BlocksRemoved:
    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AllCleared:
    pass


KvEvent = BlocksStored | BlocksRemoved | AllCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    seq: int
    ts: float
    events: tuple[KvEvent, ...]
    rank: int


def read_seq(frame: bytes) -> int:
    """The sequence frame as an integer: 8 bytes big-endian; replay's end marker reads as -1."""
    if len(frame) != 8:
        raise MalformedBatch(f"sequence frame of {len(frame)} bytes, not 8")
    return int.from_bytes(frame, "big", signed=True)


def decode_batch(seq: int, payload: bytes) -> EventBatch:
    """One published batch; unknown event types (medium changes, newer kinds) are skipped."""
    try:
        raw = _DECODER.decode(payload)
    except msgspec.DecodeError as exc:
        raise MalformedBatch(f"not msgpack: {exc}") from None
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise MalformedBatch("a batch is [ts, events, rank]")
    ts = float(raw[0]) if isinstance(raw[0], int | float) else 0.0
    rank = raw[2] if len(raw) > 2 and isinstance(raw[2], int) else 0
    events = tuple(event for event in map(_event, raw[1]) if event is not None)
    return EventBatch(seq=seq, ts=ts, events=events, rank=rank)


def _event(raw: Any) -> KvEvent | None:
    if isinstance(raw, dict):
        kind, fields = raw.get("type"), raw
    elif isinstance(raw, list) and raw and isinstance(raw[0], str):
        kind, fields = raw[0], _array_fields(raw)
    else:
        raise MalformedBatch(f"an event is a map or a tagged array, not {type(raw).__name__}")
    if kind == "BlockStored":
        return _stored(fields)
    if kind == "BlockRemoved":
        return BlocksRemoved(_hashes(fields.get("block_hashes")))
    if kind == "AllBlocksCleared":
        return AllCleared()
    return None


def _array_fields(raw: list[Any]) -> dict[str, Any]:
    if raw[0] == "BlockRemoved":
        return {"block_hashes": raw[1] if len(raw) > 1 else None}
    fields = dict(zip(_ARRAY_STORED, raw[1:], strict=False))
    if len(raw) > _ARRAY_STORED_EXTRA_KEYS:
        fields["extra_keys"] = raw[_ARRAY_STORED_EXTRA_KEYS]
    return fields


def _stored(fields: dict[str, Any]) -> BlocksStored:
    hashes = _hashes(fields.get("block_hashes"))
    token_ids = fields.get("token_ids")
    block_size = fields.get("block_size")
    if not isinstance(token_ids, list) or not isinstance(block_size, int) or block_size < 1:
        raise MalformedBatch("BlockStored needs token_ids and a block_size")
    if len(token_ids) != len(hashes) * block_size:
        raise MalformedBatch(f"{len(hashes)} blocks of {block_size} tokens but {len(token_ids)} token ids")
    parent = fields.get("parent_block_hash")
    return BlocksStored(
        hashes=hashes,
        parent=None if parent is None else _hash(parent),
        token_ids=token_ids,
        block_size=block_size,
        salt=_salt(fields),
    )


def _salt(fields: dict[str, Any]) -> str | None:
    salt = fields.get("cache_salt")
    if isinstance(salt, str) and salt:
        return salt
    extra = fields.get("extra_keys")
    # vLLM puts a request's cache salt last among the first block's extra keys.
    if isinstance(extra, list) and extra and isinstance(extra[0], list | tuple) and extra[0]:
        last = extra[0][-1]
        if isinstance(last, str) and last:
            return last
    return None


def _hashes(raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list):
        raise MalformedBatch("block_hashes is a list")
    return tuple(map(_hash, raw))


def _hash(raw: Any) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, bytes):
        return xxhash.xxh3_64_intdigest(raw)
    raise MalformedBatch(f"a block hash is an integer or bytes, not {type(raw).__name__}")
