"""Live policy edits: validate a new config, swap it in whole, keep every version, and share them.

Edits arrive from the admin API, from the YAML file changing on disk, or (with Redis) from another
gateway process. Each is validated in full first; a refused edit changes nothing. An accepted one becomes
a numbered version: recorded durably, applied by swapping the state's catalog (requests already admitted
finish under the version they started with), and with Redis published so that every process applies it.
Settings the gateway can only take at start-up (listen address, state store, simulators) are refused
with a message saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import redis.asyncio as aioredis
import yaml

from spillgate.backends.backend import Backend
from spillgate.gateway.control.catalog import Catalog, Endpoints, build_catalog
from spillgate.gateway.control.config import ConfigError, GatewayConfig, parse_config
from spillgate.gateway.control.config_history import (
    ConfigVersion,
    Destination,
    LocalHistory,
    file_digest,
    known_keys,
    new_version,
    redact,
    unredact,
)
from spillgate.gateway.control.egress import SecretBindings, env_problems, env_references, startup_hosts, url_problems
from spillgate.gateway.control.plain_data import non_json_problems
from spillgate.gateway.control.secrets import MissingSecret
from spillgate.gateway.tasks import stop_if_cancelled
from spillgate.gateway.tenancy.tenants import resolve_key


class ConfigTarget(Protocol):
    """What a config version is applied to: the running gateway (:class:`gateway.state.GatewayState`)."""

    config: GatewayConfig
    endpoints: Endpoints
    registry: Iterable[Backend]

    def apply(self, catalog: Catalog) -> None:
        """Serve ``catalog`` from now on; requests already admitted finish on the one they started with."""
        ...


log = logging.getLogger("spillgate.config")

_RESTART_ONLY = ("listen", "state", "prefix", "health", "timeouts", "secrets")
_NEXT_VERSION = """
local n = redis.call('INCR', KEYS[1])
local floor = tonumber(ARGV[1])
if n <= floor then
  n = floor + 1
  redis.call('SET', KEYS[1], n)
end
return n
"""
"""The fleet's version counter, raised past ``floor`` (the caller's latest) when it is behind."""
_FILE_POLL_S = 1.0
_REDIS_POLL_S = 0.25


class LiveConfig:
    """The running config's versions, and the one way to change them."""

    def __init__(self, state: ConfigTarget, raw: dict[str, Any], *, path: Path | None) -> None:
        self._state = state
        self._path = path
        self._redis: aioredis.Redis | None = None
        self._refused = 0
        self._keys = f"{state.config.state.key_prefix}:config"
        self._history = LocalHistory(Path(state.config.state.data_dir) / "config-history.jsonl")
        self._lock = asyncio.Lock()
        self._file_sha = file_digest(path.read_text()) if path else None
        self._startup_raw = raw
        self._startup_hosts = startup_hosts(raw)
        """Where the config at start sends requests: the hosts an edit may use unless ``secrets.upstream_hosts``
        says otherwise."""
        self._bindings = SecretBindings(raw, state.config.secrets.upstream_hosts, _provider_of)
        self._startup_env = {name for _, name in env_references(raw)}
        """The environment variables the config at start names: the only ones an edit may name, unless
        ``secrets.env`` lists others."""
        self._started = state.config
        """The config this process started with: its simulated backends are the ones running, whatever version
        runs now, so a version may drop them and a later one bring them back."""
        self._running_raw = raw
        """The running config with its secrets: kept in memory only; versions store it redacted."""
        self._secrets: dict[tuple[str, str], tuple[Destination, object]] = {}
        """Every provider and replica key this process has been given, with where it was to be sent."""
        """The latest provider key each hosted model had in a version this process ran (in memory only): a
        rollback to a version whose model a later one removed gets its key back from here."""
        self._remember_keys(raw)
        self.current = ConfigVersion(0, 0.0, "startup", redact(raw), ())
        self._tasks: list[asyncio.Task[None]] = []

    # -- reading -----------------------------------------------------------------------------------------

    def history(self) -> list[ConfigVersion]:
        return list(self._history.versions)

    def version(self, number: int) -> ConfigVersion | None:
        return self._history.get(number)

    # -- changing ----------------------------------------------------------------------------------------

    async def propose(
        self, raw: object, author: str, *, file_sha: str | None = None, keeping_admin: str | None = None
    ) -> ConfigVersion:
        """Validate ``raw`` and make it the running version; :class:`ConfigError` lists every problem.
        ``file_sha`` is the digest of the config file's new content when the edit came from the file;
        ``keeping_admin`` the digest of the admin key an API change was made with, which it must keep: an edit
        that dropped it would lock its author out of the admin API, rollback included."""
        async with self._lock:
            problems = non_json_problems(raw)
            if problems:  # before anything copies it as JSON
                raise ConfigError.listing(problems, "config: ")
            if isinstance(raw, dict):
                # Start-up settings left out of an edit stay as they are; redacted secrets are put back.
                kept = {key: self._running_raw[key] for key in _RESTART_ONLY if key in self._running_raw}
                raw = kept | self._unredact(raw)
            config = self._validate(raw)
            if keeping_admin is not None and keeping_admin not in admin_digests(config):
                problem = (
                    "admin.keys",
                    "must keep the admin key this change was made with: without it the admin API would refuse "
                    "every call from it, rollback included (a key is removed by another admin key, or in the file)",
                )
                raise ConfigError(f"config: {problem[0]}: {problem[1]}", [problem])
            assert isinstance(raw, dict)
            number = await self._next_number()
            if file_sha is not None:
                self._file_sha = file_sha
            version = new_version(number, author, redact(raw), self.current.raw, self._file_sha)
            self._apply(config, version, raw)
            await self._publish(version)
            log.info("config version %d applied (%s): %d change(s)", number, author, len(version.diff))
            return version

    async def rollback(self, number: int, author: str, *, keeping_admin: str | None = None) -> ConfigVersion:
        old = self._history.get(number)
        if old is None:
            raise KeyError(number)
        return await self.propose(old.raw, f"{author} (rollback to {number})", keeping_admin=keeping_admin)

    def _validate(self, raw: object) -> GatewayConfig:
        config = parse_config(raw, source="config")
        problems = restart_problems(self._started, config)
        if config.secrets.env is None:  # else checked with the config itself
            problems += env_problems(raw, self._startup_env)
        if config.secrets.upstream_hosts is None:  # else checked with the config itself
            problems += url_problems(raw, self._startup_hosts, default=True)
        problems += self._bindings.problems(raw)
        if problems:
            raise ConfigError.listing(problems, "config: ")
        return config

    def _apply(
        self, config: GatewayConfig, version: ConfigVersion, raw: dict[str, Any], *, record: bool = True
    ) -> None:
        existing = {b.name: b for b in self._state.registry}
        try:
            catalog = build_catalog(config, self._state.endpoints, existing)
        except ConfigError as exc:
            raise ConfigError(f"config: {exc}", exc.problems or [("(config)", str(exc))]) from None
        except MissingSecret as exc:
            raise ConfigError(f"config: {exc}", [("(config)", str(exc))]) from None
        self._state.apply(catalog)
        self._remember_keys(raw)
        if record:
            self._history.append(version)
        self.current = version
        self._running_raw = raw

    def _remember_keys(self, raw: dict[str, Any]) -> None:
        self._secrets.update(known_keys(raw))

    def _unredact(self, raw: dict[str, Any]) -> dict[str, Any]:
        """``raw`` with the secrets a GET redacted put back; :class:`ConfigError` for a key this process never
        had, or whose destination changed (rather than a model without its key, or a key sent somewhere new)."""
        restored, problems = unredact(raw, self._secrets, (self._running_raw.get("state") or {}).get("redis_url"))
        if problems:
            raise ConfigError.listing(problems, "config: ")
        return restored

    # -- start-up, the file and other processes ------------------------------------------------------------

    async def start(self, redis: aioredis.Redis | None = None) -> None:
        """Settle which version runs: the file's, unless edits made since the file was read are newer;
        with Redis, the fleet's when it is newer still."""
        self._redis = redis
        latest = self._history.latest
        if latest is not None and latest.file_sha == self._file_sha:
            self._resume(latest)
        else:
            author = "startup" if latest is None else "file"
            number = (latest.version if latest else 0) + 1
            version = new_version(
                number, author, redact(self._startup_raw), latest.raw if latest else None, self._file_sha
            )
            self._history.append(version)
            self.current = version
        if self._redis is not None:
            await self._join_fleet()
            self._tasks.append(asyncio.create_task(self._follow_fleet(), name="spillgate-config-follow"))
        if self._path is not None:
            self._tasks.append(asyncio.create_task(self._watch_file(), name="spillgate-config-watch"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _resume(self, latest: ConfigVersion) -> None:
        """The file is as it was at ``latest``: keep the API edits made since, as that version."""
        if latest.raw == redact(self._startup_raw):
            self.current = latest
            return
        try:
            raw = self._unredact(latest.raw)
            self._apply(self._validate(raw), latest, raw, record=False)
        except ConfigError as exc:
            log.error("config version %d no longer applies, running the file instead: %s", latest.version, exc)
            self.current = latest

    async def _watch_file(self) -> None:
        assert self._path is not None
        seen = self._file_sha
        while True:
            await asyncio.sleep(_FILE_POLL_S)
            try:
                text = self._path.read_text()
            except OSError:
                continue
            sha = file_digest(text)
            if sha in (seen, self._file_sha):
                continue  # unchanged, or back to the content the running version came from
            seen = sha
            try:
                raw = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                log.error(
                    "%s changed but is not valid YAML; keeping version %d: %s", self._path, self.current.version, exc
                )
                continue
            if isinstance(raw, dict) and redact(raw) == self.current.raw:
                self._file_sha = sha
                continue
            try:
                await self.propose(raw, "file", file_sha=sha)
            except ConfigError as exc:
                log.error("%s changed but was refused; keeping version %d:\n%s", self._path, self.current.version, exc)
            except (aioredis.RedisError, OSError) as exc:
                log.error("%s changed but Redis is unreachable, so it was not applied: %s", self._path, exc)

    async def _next_number(self) -> int:
        """The next version number, fleet-wide with Redis; never at or below one this process has seen, even
        when Redis came back empty (its counter restarting at 1 would make every other process ignore it)."""
        floor = max(self.current.version, self._history.latest.version if self._history.latest else 0)
        if self._redis is None:
            return floor + 1
        return int(await self._redis.eval(_NEXT_VERSION, 1, f"{self._keys}:seq", floor))

    async def _publish(self, version: ConfigVersion) -> None:
        if self._redis is None:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(f"{self._keys}:versions", str(version.version), version.to_json())
            pipe.set(f"{self._keys}:current", version.version)
            await pipe.execute()

    async def _join_fleet(self) -> None:
        """Adopt the fleet's version if it is newer; else make ours the fleet's."""
        assert self._redis is not None
        try:
            fleet = int(await self._redis.get(f"{self._keys}:current") or 0)
            if fleet > self.current.version:
                await self._adopt(fleet)
                return
            if fleet < self.current.version:
                await self._redis.set(f"{self._keys}:seq", self.current.version)
                await self._publish(self.current)
        except (aioredis.RedisError, OSError) as exc:
            log.warning("Redis unreachable at start-up; running config version %d alone: %s", self.current.version, exc)

    async def _follow_fleet(self) -> None:
        assert self._redis is not None
        while True:
            await asyncio.sleep(_REDIS_POLL_S)
            try:
                fleet = int(await self._redis.get(f"{self._keys}:current") or 0)
                if fleet > self.current.version and fleet != self._refused:
                    async with self._lock:
                        await self._adopt(fleet)
            except (aioredis.RedisError, OSError) as exc:
                stop_if_cancelled(exc)
                continue  # the fleet's version is picked up when Redis answers again

    async def _adopt(self, number: int) -> None:
        assert self._redis is not None
        text = await self._redis.hget(f"{self._keys}:versions", str(number))
        if text is None:
            return
        fleet = ConfigVersion.from_json(text.decode() if isinstance(text, bytes) else text)
        # Start-up settings belong to each process (its own listen address and data directory).
        local = {key: self._running_raw[key] for key in _RESTART_ONLY if key in self._running_raw}
        shared = {key: value for key, value in fleet.raw.items() if key not in _RESTART_ONLY}
        try:
            raw = self._unredact(shared) | local
            version = ConfigVersion(number, fleet.applied_at, fleet.author, redact(raw), fleet.diff, self._file_sha)
            self._apply(self._validate(raw), version, raw)
        except ConfigError as exc:
            self._refused = number
            log.error("fleet config version %d cannot run here; keeping %d: %s", number, self.current.version, exc)
            return
        log.info("config version %d adopted from the fleet", number)


def _provider_of(model: str) -> str | None:
    """The litellm provider of ``model``; litellm takes seconds to import, so only a hosted model without an
    ``api_base`` pays for it."""
    from spillgate.backends.hosted.client import provider_of

    return provider_of(model)


def restart_problems(old: GatewayConfig, new: GatewayConfig) -> list[tuple[str, str]]:
    """Changes a running gateway cannot make: listed by field, each saying a restart is needed."""
    problems = [
        (field, "takes effect only at start-up; restart the gateway to change it")
        for field in _RESTART_ONLY
        if getattr(old, field) != getattr(new, field)
    ]
    started = {p.name: p.simulated for p in old.pools}
    for index, pool in enumerate(new.pools):
        if pool.simulated is not None and started.get(pool.name) != pool.simulated:
            problems.append(
                (f"pools.{index}.simulated", "simulated replicas start with the gateway; restart to change")
            )
    started_hosted = {h.name: h.simulated for h in old.hosted_models}
    for index, hosted in enumerate(new.hosted_models):
        if hosted.simulated is not None and started_hosted.get(hosted.name) != hosted.simulated:
            problems.append(
                (f"hosted_models.{index}.simulated", "simulated models start with the gateway; restart to change")
            )
    return problems


def admin_digests(config: GatewayConfig) -> set[str]:
    """The digests of ``config``'s admin keys (those whose secret cannot be read are left out)."""
    digests = set()
    for spec in config.admin.keys:
        with contextlib.suppress(MissingSecret):
            digests.add(resolve_key(spec))
    return digests
