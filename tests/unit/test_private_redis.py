"""The private redis-server of ``spillgate serve --workers N``: reachable only by its owner, through a unix socket
in a 0700 directory, and by the clients the gateway builds from its URL."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from spillgate.gateway.accounting import make_client
from spillgate.gateway.supervisor import PrivateRedis


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    if not PrivateRedis.available():
        pytest.skip("redis-server is not installed")
    server = PrivateRedis()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_it_listens_on_no_tcp_port_only_on_a_socket_only_its_owner_may_open(private_redis: PrivateRedis) -> None:
    assert private_redis.url.startswith("unix://"), private_redis.url
    socket_path = Path(private_redis.url.removeprefix("unix://"))
    directory = socket_path.parent
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert directory.stat().st_uid == os.getuid()
    assert stat.S_ISSOCK(socket_path.stat().st_mode)
    assert stat.S_IMODE(socket_path.stat().st_mode) & 0o077 == 0, "group and others may not open the socket"
    client = redis.Redis.from_url(private_redis.url)
    try:
        assert client.config_get("port") == {"port": "0"}, "no TCP listener at all"
    finally:
        client.close()


async def test_the_gateway_clients_reach_it_by_its_url(private_redis: PrivateRedis) -> None:
    """Both ways the gateway connects to Redis (the hot path's pool, and plain clients) accept ``unix://``."""
    hot_path = make_client(private_redis.url)
    plain = aioredis.from_url(private_redis.url, socket_timeout=2.0)
    try:
        await hot_path.set("spillgate:probe", "1")
        assert await plain.get("spillgate:probe") == b"1"
    finally:
        await hot_path.aclose()
        await plain.aclose()


def test_stopping_it_removes_its_directory() -> None:
    if not PrivateRedis.available():
        pytest.skip("redis-server is not installed")
    server = PrivateRedis()
    url = server.start()
    directory = Path(url.removeprefix("unix://")).parent
    server.stop()
    assert not directory.exists()
