"""Which store a gateway's stored responses live in: Redis when ``state.redis_url`` is set, else a file in the data
directory (:mod:`.response_store_file`). Read per call, so a config change that adds Redis (or moves it) applies to
the next request; the face and the ``GET``/``DELETE`` routes of one gateway share the same store
(:func:`stores_for`)."""

from __future__ import annotations

import weakref

from spillgate.gateway.accounting import make_client
from spillgate.gateway.control.secrets import resolve_secret
from spillgate.gateway.faces.response_store import ResponseStore
from spillgate.gateway.faces.response_store_file import FileStore
from spillgate.gateway.faces.response_store_redis import RedisStore
from spillgate.gateway.state import GatewayState


class ResponseStores:
    """The store the live config names, each kept once made (one Redis client per URL and prefix)."""

    def __init__(self, state: GatewayState) -> None:
        self._state = state
        self._file = FileStore(state.data_dir)
        self._redis: dict[tuple[str, str], RedisStore] = {}

    def current(self) -> ResponseStore:
        settings = self._state.config.state
        if not settings.redis_url:
            return self._file
        key = (settings.redis_url, settings.key_prefix)
        store = self._redis.get(key)
        if store is None:
            store = self._redis[key] = RedisStore(make_client(resolve_secret(settings.redis_url)), settings.key_prefix)
        return store

    @property
    def ttl_s(self) -> float:
        return self._state.config.responses.store_ttl_s

    @property
    def limit(self) -> int:
        return self._state.config.responses.max_stored_per_tenant


_STORES: dict[int, tuple[weakref.ref[GatewayState], ResponseStores]] = {}


def stores_for(state: GatewayState) -> ResponseStores:
    """The one :class:`ResponseStores` of ``state`` (the face and the routes are built separately from it)."""
    found = _STORES.get(id(state))
    if found is not None and found[0]() is state:
        return found[1]
    stores = ResponseStores(state)
    key = id(state)
    _STORES[key] = (weakref.ref(state, lambda _, key=key: _STORES.pop(key, None)), stores)  # type: ignore[misc]
    return stores
