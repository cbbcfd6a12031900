"""Live policy edits: validate a new config, swap it in whole, keep every version, and share them.

Edits arrive from the admin API, from the YAML file changing on disk, or (with Redis) from another
gateway process. Each is validated in full first (:mod:`config_checks`: every problem of every check); a
refused edit changes nothing. An accepted one becomes a numbered version: recorded durably, applied by swapping
the state's catalog (requests already admitted finish under the version they started with), and with Redis
published so that every process applies it.

With Redis, processes share one line of versions: a change is made on top of the fleet's latest version (adopted
first when another process published a newer one) and published only if no other version was published since
(compare-and-set on the fleet's current version). A change that loses that race changes nothing: an edit of one
part is made again on top of the winner; a whole config is refused with :class:`ConfigConflict`.

The file and the admin API never silently undo each other (:mod:`file_drift`). The running config is the file's
plus the edits made since it was applied; a new file content that would undo one of those edits is not applied:
it is logged as an error and shown on ``/health`` until the file takes the edits in, or an admin says the file
wins (``POST /admin/config/reload``). A restart follows the same rule, so an accepted edit survives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import redis.asyncio as aioredis

from spillgate.backends.backend import Backend
from spillgate.gateway.control.catalog import Catalog, Endpoints
from spillgate.gateway.control.config import ConfigError, GatewayConfig
from spillgate.gateway.control.config_checks import RESTART_ONLY, EditRules, check_edit
from spillgate.gateway.control.config_file import FileContent, read_config_file
from spillgate.gateway.control.config_history import (
    REDACTED,
    ConfigVersion,
    Destination,
    change_summary,
    known_keys,
    new_version,
    redact,
    unredact,
)
from spillgate.gateway.control.egress import SecretBindings, env_references, replica_url, startup_hosts
from spillgate.gateway.control.file_drift import drift, shared, undone_by
from spillgate.gateway.control.history_store import LocalHistory, owner_of, secrets_name
from spillgate.gateway.control.plain_data import non_json_problems
from spillgate.gateway.control.replica_edits import ReplicaEditRefused
from spillgate.gateway.control.secret_store import SecretStore
from spillgate.gateway.control.secrets import MissingSecret
from spillgate.gateway.tasks import stop_if_cancelled


class ConfigTarget(Protocol):
    """What a config version is applied to: the running gateway (:class:`gateway.state.GatewayState`)."""

    config: GatewayConfig
    endpoints: Endpoints
    registry: Iterable[Backend]

    def catalog_for(self, config: GatewayConfig) -> Catalog:
        """What ``config`` builds on the running backends, with the replicas discovered now."""
        ...

    def apply(self, catalog: Catalog) -> None:
        """Serve ``catalog`` from now on; requests already admitted finish on the one they started with."""
        ...


log = logging.getLogger("spillgate.config")

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
_PUBLISH = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current > tonumber(ARGV[1]) then
  return current
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('SET', KEYS[1], ARGV[2])
return 0
"""
"""Publish version ``ARGV[2]`` unless a version newer than ``ARGV[1]`` (the one it was made on top of) was published
since: then nothing is written and the newer one's number returned."""
_FILE_POLL_S = 1.0
_REDIS_POLL_S = 0.25
_SHOWN_PATHS = 8


@dataclass(frozen=True)
class HeldFile:
    """A file content the gateway read and did not apply, and why."""

    sha: str
    warning: str
    """For ``/health``, which needs no key: counts and field paths, no values."""
    detail: dict[str, Any]
    """For the admin API: the edits it would undo, or every problem with its message."""


class ConfigConflict(ReplicaEditRefused):
    """Another gateway process published a version while this change was made on an older one: nothing changed.
    The admin API answers it as any refused edit (409, ``config_conflict``)."""


class _Superseded(Exception):
    """Publishing lost the race to version ``number`` of another process (already adopted here, if it runs)."""

    def __init__(self, number: int) -> None:
        super().__init__(number)
        self.number = number


class LiveConfig:
    """The running config's versions, and the one way to change them."""

    def __init__(self, state: ConfigTarget, raw: dict[str, Any], *, path: Path | None) -> None:
        self._state = state
        self._path = path
        self._redis: aioredis.Redis | None = None
        self._refused = 0
        self._keys = f"{state.config.state.key_prefix}:config"
        self._lock = asyncio.Lock()
        content = read_config_file(path) if path else None
        self._seen = content if content is not None and content.raw == raw else None
        """The file as last read (``None``: not read yet, or changed since the process read it)."""
        self._file_sha = self._seen.sha if self._seen else None
        self._file_raw = redact(raw)
        """The file content (digest, and config redacted) the running version was made from or on top of: what
        it has beyond this are edits the file lacks."""
        data_dir = state.data_dir
        self._history = LocalHistory.open(data_dir, path, self._file_sha)
        self._kept_keys = SecretStore(data_dir / secrets_name(owner_of(path)))
        self._file_keys = known_keys(raw)
        """The provider and replica keys the config file holds: those need not be kept apart."""
        self._startup_raw = raw
        self._rules = EditRules(
            started=state.config,
            startup_env=frozenset(name for _, name in env_references(raw)),
            startup_hosts=tuple(startup_hosts(raw)),
            bindings=SecretBindings(raw, state.config.secrets.upstream_hosts, _provider_of),
            endpoints=state.endpoints,
        )
        self._running_raw = raw
        """The running config with its secrets: kept in memory only; versions store it redacted."""
        self._secrets: dict[tuple[str, str], tuple[Destination, object]] = self._kept_keys.keys()
        """Every provider and replica key this process has been given (or an earlier one, through the API), with
        where it was to be sent: a rollback to a version whose model a later one removed gets its key back from
        here. Where two are known, the running one."""
        self._remember_keys(raw)
        self._held: HeldFile | None = None
        self._troubles: dict[str, str] = {}
        """Other warnings by what they are about: ``restore`` (until the next accepted change), ``fleet`` (until a
        fleet version runs here)."""
        self.current = ConfigVersion(0, 0.0, "startup", redact(raw), ())
        self._tasks: list[asyncio.Task[None]] = []

    # -- reading -----------------------------------------------------------------------------------------

    def history(self) -> list[ConfigVersion]:
        return list(self._history.versions)

    def version(self, number: int) -> ConfigVersion | None:
        return self._history.get(number)

    def history_owner(self) -> dict[str, str]:
        """Whose history this is: the config file and the id the history got when it began."""
        return {"config": self._history.owner.config, "id": self._history.owner.id}

    @property
    def warnings(self) -> list[str]:
        """What an operator must act on, one line each (``/health`` shows them): a file content not applied, a
        version that could not be restored at start, a fleet version this process cannot run. Empty when none."""
        return ([self._held.warning] if self._held else []) + list(self._troubles.values())

    def file_status(self) -> dict[str, Any] | None:
        """The file against the running config, for the admin API: the edits it lacks, and a content not applied."""
        if self._path is None:
            return None
        edits = drift(self._file_raw, self.current.raw)
        return {
            "path": str(self._path),
            "in_sync": not edits and self._held is None,
            "not_in_file": edits,
            "not_applied": self._held.detail if self._held else None,
        }

    # -- changing ----------------------------------------------------------------------------------------

    async def propose(
        self,
        raw: object,
        author: str,
        *,
        keeping_admin: str | None = None,
        file: FileContent | None = None,
        base_version: int | None = None,
    ) -> ConfigVersion:
        """Validate ``raw`` and make it the running version; :class:`ConfigError` lists every problem.
        ``file`` is the config file's content when the change is the file's; ``keeping_admin`` the digest of the
        admin key an API change was made with, which it must keep: an edit that dropped it would lock its author
        out of the admin API, rollback included. ``base_version``: the version ``raw`` was edited from (an
        ``If-Match``); refused with :class:`ConfigConflict` (412) when another version runs now, so an edit made on
        a copy read earlier cannot silently undo the changes made since."""
        async with self._lock:
            await self._catch_up()
            if base_version is not None and base_version != self.current.version:
                raise ConfigConflict(
                    412,
                    f"The change was made on config version {base_version}, but version {self.current.version} "
                    "runs now; nothing changed. GET /admin/config and send the change again on top of it.",
                    "config_version_mismatch",
                    "If-Match",
                )
            try:
                return await self._change(raw, author, keeping_admin=keeping_admin, file=file)
            except _Superseded as lost:
                raise self._conflict(lost.number) from None

    async def _change(
        self, raw: object, author: str, *, keeping_admin: str | None, file: FileContent | None
    ) -> ConfigVersion:
        try:
            config, raw = self._check(raw, keeping_admin)
        except ConfigError as exc:
            level = logging.ERROR if file is not None else logging.WARNING
            log.log(
                level,
                "config change from %s refused; version %d keeps running: %s",
                self._origin(author),
                self.current.version,
                _problem_list(exc),
            )
            raise
        catalog = self._catalog(config)  # before publishing: a version this process cannot build is never shared
        number = await self._next_number()
        file_sha = file.sha if file is not None else self._file_sha
        file_raw = None if file is not None else self._file_raw
        version = new_version(number, author, redact(raw), self.current.raw, file_sha, file_raw)
        if file is None:  # kept before it is published: a worker sharing the data directory adopting it finds them
            self._kept_keys.keep(known_keys(raw), self._file_keys)
        winner = await self._publish(version)
        if winner is not None:
            log.warning(
                "config change from %s not applied: another gateway process published version %d first",
                self._origin(author),
                winner,
            )
            if winner != self._refused:
                await self._adopt(winner)
            raise _Superseded(winner)
        with contextlib.suppress(ConfigError):  # again: discovered replicas may have changed while Redis answered
            catalog = self._catalog(config)
        self._install(catalog, raw)
        self._record(version)
        if file is not None:
            self._file_sha, self._file_raw, self._held = file.sha, redact(raw), None
            self._file_keys = known_keys(raw)
        self._kept_keys.keep(known_keys(raw), self._file_keys)
        self._troubles.pop("restore", None)  # a version runs that someone chose since
        log.warning("config version %d applied from %s: %s", number, self._origin(author), change_summary(version.diff))
        self._reconcile()
        return version

    async def edit(
        self, change: Callable[[dict[str, Any]], dict[str, Any]], author: str, *, keeping_admin: str | None = None
    ) -> ConfigVersion:
        """Make ``change`` to the running config (a copy, secrets in the clear) and propose the result, as one step
        (no other change lands in between): an edit of one part without shipping the whole config. ``change`` may
        raise to refuse. A key configured at start goes where :class:`SecretBindings` allow, as in any edit; a key
        sent later through the API stays on the replicas it was sent for (the redaction rule of a ``PUT``).

        Made on the fleet's latest version; when another process publishes first, made once more on top of
        its version (``change`` is called again), then refused with :class:`ConfigConflict`."""
        async with self._lock:
            await self._catch_up()
            try:
                return await self._edit_once(change, author, keeping_admin)
            except _Superseded:
                pass  # made again below, on top of the version that won (already adopted)
            try:
                return await self._edit_once(change, author, keeping_admin)
            except _Superseded as lost:
                raise self._conflict(lost.number) from None

    async def _edit_once(
        self, change: Callable[[dict[str, Any]], dict[str, Any]], author: str, keeping_admin: str | None
    ) -> ConfigVersion:
        raw = change(copy.deepcopy(self._running_raw))
        problems = self._unbound_key_moves(raw)
        if problems:
            exc = ConfigError.listing(problems, "config: ")
            log.warning(
                "config change from %s refused; version %d keeps running: %s",
                self._origin(author),
                self.current.version,
                _problem_list(exc),
            )
            raise exc
        return await self._change(raw, author, keeping_admin=keeping_admin, file=None)

    def _unbound_key_moves(self, raw: dict[str, Any]) -> list[tuple[str, str]]:
        """Pools whose key was not configured at start (sent through the API) and that ``raw`` would send it to a
        replica, or a discovery, it was not sent for."""
        running = {p.get("name"): p for p in self._running_raw.get("pools") or [] if isinstance(p, dict)}
        problems = []
        for index, pool in enumerate(raw.get("pools") or []):
            if not isinstance(pool, dict) or not pool.get("api_key") or self._rules.bindings.bound(pool["api_key"]):
                continue
            before = running.get(pool.get("name")) or {}
            added = _replica_urls(pool) - _replica_urls(before)
            if added or pool.get("discovery") != before.get("discovery"):
                problems.append(
                    (
                        f"pools.{index}.api_key",
                        "this pool's key was sent through the admin API, so it goes only to the replicas it was sent "
                        "for: to send it to a new one, PUT the config with the key",
                    )
                )
        return problems

    async def rollback(self, number: int, author: str, *, keeping_admin: str | None = None) -> ConfigVersion:
        """Run version ``number``'s config again, as a new version; start-up settings stay as they run."""
        old = self._history.get(number)
        if old is None:
            raise KeyError(number)
        return await self.propose(shared(old.raw), f"{author} (rollback to {number})", keeping_admin=keeping_admin)

    async def reload(self, author: str) -> ConfigVersion:
        """Apply the config file as it is now, undoing the edits it lacks: the operator's word that the file wins."""
        content = read_config_file(self._path) if self._path is not None else None
        if content is None or content.error is not None:
            problem = content.error if content is not None else "this gateway has no config file it can read"
            raise ConfigError(f"config file: {problem}", [("(file)", problem)])
        async with self._lock:
            self._seen = content
            await self._catch_up()
            try:
                return await self._change(content.raw, f"file (reloaded by {author})", keeping_admin=None, file=content)
            except _Superseded as lost:
                raise self._conflict(lost.number) from None

    def _check(self, raw: object, keeping_admin: str | None) -> tuple[GatewayConfig, dict[str, Any]]:
        """``raw`` as a config to run (start-up settings kept, redacted secrets restored), or every problem."""
        problems = non_json_problems(raw)
        if problems:  # before anything copies it as JSON
            raise ConfigError.listing(problems, "config: ")
        if not isinstance(raw, dict):
            problem = ("(top level)", f"expected a mapping at the top level, got {type(raw).__name__}")
            raise ConfigError.listing([problem], "config: ")
        # Start-up settings left out of an edit stay as they are; redacted secrets are put back.
        kept = {key: self._running_raw[key] for key in RESTART_ONLY if key in self._running_raw}
        restored, secret_problems = self._unredact(raw)
        secret_problems += self._discovery_moves(raw)
        raw = kept | restored
        return check_edit(raw, self._rules, secret_problems=secret_problems, keeping_admin=keeping_admin), raw

    def _discovery_moves(self, raw: dict[str, Any]) -> list[tuple[str, str]]:
        """A redacted pool key is restored only onto the replicas it was sent for: not onto pods of a discovery
        the pool did not have, or had with another namespace or selector (the key must be sent again)."""
        running = {p.get("name"): p for p in self._running_raw.get("pools") or [] if isinstance(p, dict)}
        problems = []
        for index, pool in enumerate(raw.get("pools") or []):
            if not isinstance(pool, dict) or pool.get("api_key") != REDACTED or not pool.get("discovery"):
                continue
            if pool.get("discovery") != (running.get(pool.get("name")) or {}).get("discovery"):
                message = "a redacted key is not restored onto a new discovery (other pods): send the key again"
                problems.append((f"pools.{index}.api_key", message))
        return problems

    def _apply(self, config: GatewayConfig, raw: dict[str, Any]) -> None:
        self._install(self._catalog(config), raw)

    def _catalog(self, config: GatewayConfig) -> Catalog:
        """What ``config`` builds here, or :class:`ConfigError`: built before a version is published, so that one
        this process cannot run is never shared."""
        try:
            return self._state.catalog_for(config)
        except ConfigError as exc:
            raise ConfigError(f"config: {exc}", exc.problems or [("(config)", str(exc))]) from None
        except MissingSecret as exc:
            raise ConfigError(f"config: {exc}", [("(config)", str(exc))]) from None

    def _install(self, catalog: Catalog, raw: dict[str, Any]) -> None:
        self._state.apply(catalog)
        self._remember_keys(raw)
        self._running_raw = raw

    def _record(self, version: ConfigVersion) -> None:
        self._history.append(version)
        self.current = version

    def _remember_keys(self, raw: dict[str, Any]) -> None:
        self._secrets.update(known_keys(raw))

    def _unredact(
        self, raw: dict[str, Any], keys: dict[tuple[str, str], tuple[Destination, object]] | None = None
    ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """``raw`` with the secrets a GET redacted put back (from ``keys``, by default those known), and a problem
        for each key this process never had, or whose destination changed (rather than a model without its key,
        or a key sent somewhere new)."""
        keys = self._secrets if keys is None else keys
        return unredact(raw, keys, (self._running_raw.get("state") or {}).get("redis_url"))

    def _origin(self, author: str) -> str:
        if author.startswith("admin:"):
            return f"the admin API ({author})"
        if author.startswith("file"):
            return f"the config file {self._path}" + (f" ({author[6:-1]})" if author != "file" else "")
        return author

    # -- the file ------------------------------------------------------------------------------------------

    def _as_edit(self, file: dict[str, Any]) -> dict[str, Any]:
        """A redacted file config as an edit of it would run: start-up settings it leaves out kept."""
        return {key: value for key, value in self.current.raw.items() if key in RESTART_ONLY} | file

    def _reconcile(self) -> None:
        """After a change: when the file as last read now says what runs, the file has every edit."""
        seen = self._seen
        candidate = seen.redacted() if seen is not None else None
        if seen is None or candidate is None or self._as_edit(candidate) != self.current.raw:
            return
        if self._held is not None or self._file_sha != seen.sha:
            log.warning("the config file %s now matches config version %d", self._path, self.current.version)
        self._file_sha, self._file_raw, self._held = seen.sha, candidate, None

    async def _file_changed(self, content: FileContent, *, retried: bool = False) -> None:
        """Apply a new file content, unless it would undo an edit the file lacks or it is refused: then hold it."""
        if content.sha == self._file_sha:  # back to the content the running version was made from or on top of
            self._held = None
            return
        candidate = content.redacted()
        if candidate is not None and self._as_edit(candidate) == self.current.raw:
            self._reconcile()
            return
        if content.error is not None:
            self._hold_refused(content, [("(file)", content.error)])
            return
        undone = undone_by(candidate, self._file_raw, self.current.raw) if candidate is not None else []
        if candidate is not None and shared(candidate) == shared(self._file_raw):
            # What an edit can change is as before: a comment, the layout, or a start-up setting (refused below).
            if all(candidate[key] == self.current.raw.get(key) for key in RESTART_ONLY if key in candidate):
                self._file_sha, self._held = content.sha, None
                return
            undone = []
        if undone:
            self._hold_undoing(content, undone)
            return
        try:
            await self._change(content.raw, "file", keeping_admin=None, file=content)
        except _Superseded as lost:
            # Another process (one watching the same file, often) published first: decide again on top of its
            # version, which may be this very content.
            if not retried and lost.number != self._refused:
                await self._file_changed(content, retried=True)
                return
            log.error("%s changed but another gateway process changed the config at the same time", self._path)
            warning = (
                f"config file {self._path} changed but is not applied: the config changed meanwhile; save it again"
            )
            self._held = HeldFile(content.sha, warning, {"reason": "another change landed at the same time"})
        except ConfigError as exc:
            self._hold_refused(content, exc.problems or [("(file)", str(exc))])
        except (aioredis.RedisError, OSError) as exc:
            log.error("%s changed but Redis is unreachable, so it was not applied: %s", self._path, exc)
            warning = f"config file {self._path} changed but is not applied: Redis was unreachable; save it again"
            self._held = HeldFile(content.sha, warning, {"reason": "Redis was unreachable"})

    def _hold_undoing(self, content: FileContent, undone: list[str]) -> None:
        warning = (
            f"config file {self._path} changed but is not applied: it would undo {len(undone)} change(s) made through "
            f"the admin API (or another gateway process) that the file does not have: {_paths(undone)}. Put them in "
            f"the file (GET /admin/config shows them), or POST /admin/config/reload to apply the file as it is"
        )
        log.error("%s; version %d keeps running", warning, self.current.version)
        detail = {"reason": "it would undo edits the file does not have", "would_undo": undone}
        self._held = HeldFile(content.sha, warning, detail)

    def _hold_refused(self, content: FileContent, problems: list[tuple[str, str]]) -> None:
        warning = (
            f"config file {self._path} changed but is not applied: {len(problems)} problem(s) at "
            f"{_paths([path for path, _ in problems])}; version {self.current.version} keeps running"
        )
        if content.error is not None:
            log.error("%s: %s", warning, content.error)
        listed = [{"path": path, "message": message} for path, message in problems]
        self._held = HeldFile(content.sha, warning, {"reason": "refused", "problems": listed})

    async def _watch_file(self) -> None:
        assert self._path is not None
        while True:
            await asyncio.sleep(_FILE_POLL_S)
            content = read_config_file(self._path)
            if content is None or (self._seen is not None and content.sha == self._seen.sha):
                continue  # unreadable for now, or as last read
            async with self._lock:  # decided and applied as one step: an edit in between could be undone
                self._seen = content
                try:
                    await self._catch_up()
                except (aioredis.RedisError, OSError) as exc:
                    stop_if_cancelled(exc)  # decided on this process's version; publishing says if Redis is back
                await self._file_changed(content)

    # -- start-up ------------------------------------------------------------------------------------------

    async def start(self, redis: aioredis.Redis | None = None) -> None:
        """Settle which version runs: the file's, unless it would undo edits made since the file was applied
        (those are kept, and the file waits as it would while running); with Redis, the fleet's when it is newer."""
        self._redis = redis
        latest = self._history.latest
        file = redact(self._startup_raw)
        if latest is None:
            self._record(new_version(1, "startup", file, None, self._file_sha))
            log.info("config version 1 from %s (history %s)", self._path, self._history.path)
        elif latest.file_sha == self._file_sha or shared(file) in (shared(latest.raw), self._shared_base(latest)):
            self._resume(latest, [])  # the file is as before but for comments, layout or start-up settings
        else:
            base = self._file_base(latest)
            undone = undone_by(file, base if base is not None else {}, latest.raw)
            if undone:
                self._resume(latest, undone)
            else:
                version = new_version(latest.version + 1, "file", file, latest.raw, self._file_sha)
                self._record(version)
                log.warning(
                    "config version %d applied from the config file %s, changed while the gateway was stopped: %s",
                    version.version,
                    self._path,
                    change_summary(version.diff),
                )
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

    def _file_base(self, version: ConfigVersion) -> dict[str, Any] | None:
        """The file config ``version`` was made on top of (itself, when made from the file); for a version from
        before versions recorded it, the latest version made from that file content; ``None`` if unknown."""
        if version.file_raw is not None:
            return version.file_raw
        if _from_file(version.author):
            return version.raw
        earlier = [v for v in self._history.versions if v.version < version.version]
        return next((v.raw for v in reversed(earlier) if _from_file(v.author) and v.file_sha == version.file_sha), None)

    def _shared_base(self, version: ConfigVersion) -> dict[str, Any] | None:
        base = self._file_base(version)
        return shared(base) if base is not None else None

    def _resume(self, latest: ConfigVersion, undone: list[str]) -> None:
        """Run ``latest`` again, with the file's start-up settings (only the file sets them). ``undone``: the edits
        of ``latest`` the file (changed while stopped) would undo, which hold the file back as they would live."""
        file = redact(self._startup_raw)
        in_sync = shared(file) == shared(latest.raw)
        base = self._file_base(latest) or {}
        # The file is the one ``latest`` was made on top of, but for comments, layout or start-up settings.
        as_before = in_sync or shared(file) == shared(base)
        target = shared(latest.raw) | {key: value for key, value in file.items() if key in RESTART_ONLY}
        if target != file:  # its keys are the ones it ran with: those sent through the API before the file's
            restored, secret_problems = self._unredact(target, self._secrets | self._kept_keys.keys())
            try:
                raw = {key: value for key, value in self._startup_raw.items() if key in RESTART_ONLY} | restored
                self._apply(check_edit(raw, self._rules, secret_problems=secret_problems, keeping_admin=None), raw)
            except ConfigError as exc:
                self._restore_failed(latest, exc)
                return
        if not as_before:
            self._file_sha, self._file_raw = latest.file_sha, base
        if target == latest.raw:
            self.current = latest
        else:  # the file's start-up settings changed while stopped
            author = "startup" if in_sync else f"startup (version {latest.version} kept)"
            file_raw = None if in_sync else self._file_raw
            self._record(new_version(latest.version + 1, author, target, latest.raw, self._file_sha, file_raw))
        edits = drift(self._file_raw, self.current.raw)
        if edits:
            log.warning(
                "config version %d runs with edits made through the admin API that the config file %s does not "
                "have: %s",
                self.current.version,
                self._path,
                change_summary(edits),
            )
        if undone and self._seen is not None:
            self._hold_undoing(self._seen, undone)

    def _restore_failed(self, latest: ConfigVersion, exc: ConfigError) -> None:
        """``latest`` cannot run here any more (the key it was sent lost from the data directory, a variable no
        longer set): run the file, say so loudly, and keep ``latest`` in the history to roll back to."""
        version = new_version(latest.version + 1, "startup", redact(self._startup_raw), latest.raw, self._file_sha)
        self._record(version)
        self._troubles["restore"] = (
            f"config version {latest.version} could not be restored at start ({len(exc.problems)} problem(s) at "
            f"{_paths([path for path, _ in exc.problems])}); the config file runs as version {version.version}: "
            f"PUT the edit again with what it lacks, or POST /admin/config/rollback/{latest.version} once it can run"
        )
        log.error("%s: %s", self._troubles["restore"], _problem_list(exc))

    # -- other processes ------------------------------------------------------------------------------------

    async def _next_number(self) -> int:
        """The next version number, fleet-wide with Redis; never at or below one this process has seen, even
        when Redis came back empty (its counter restarting at 1 would make every other process ignore it)."""
        floor = max(self.current.version, self._history.latest.version if self._history.latest else 0)
        if self._redis is None:
            return floor + 1
        return int(await self._redis.eval(_NEXT_VERSION, 1, f"{self._keys}:seq", floor))

    async def _publish(self, version: ConfigVersion) -> int | None:
        """Make ``version`` the fleet's, unless another process published one newer than the running one (the one
        ``version`` was made on top of) since: then that one's number, and nothing written."""
        if self._redis is None:
            return None
        shared_version = replace(version, file_raw=None)  # which file it was made on top of is this process's own
        keys = (f"{self._keys}:current", f"{self._keys}:versions")
        won = await self._redis.eval(
            _PUBLISH, 2, *keys, self.current.version, version.version, shared_version.to_json()
        )
        return int(won) or None

    async def _catch_up(self) -> None:
        """Run the fleet's latest version first when another process published a newer one: a change is made on
        top of it, never on this process's older copy (that would undo the newer one)."""
        if self._redis is None:
            return
        fleet = int(await self._redis.get(f"{self._keys}:current") or 0)
        if fleet > self.current.version and fleet != self._refused:
            await self._adopt(fleet)

    def _conflict(self, number: int) -> ConfigConflict:
        message = (
            f"Another gateway process published config version {number} while this change was being made; "
            "nothing changed. GET /admin/config and send the change again on top of it."
        )
        trouble = self._troubles.get("fleet")
        return ConfigConflict(409, message + (f" ({trouble})" if trouble else ""), "config_conflict", None)

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
                winner = await self._publish(self.current)
                if winner is not None:  # another process made its own the fleet's meanwhile
                    await self._adopt(winner)
        except (aioredis.RedisError, OSError) as exc:
            log.warning("Redis unreachable at start-up; running config version %d alone: %s", self.current.version, exc)

    async def _follow_fleet(self) -> None:
        assert self._redis is not None
        while True:
            await asyncio.sleep(_REDIS_POLL_S)
            try:
                fleet = int(await self._redis.get(f"{self._keys}:current") or 0)
                if fleet > self.current.version and fleet != self._refused:
                    async with self._lock:  # a change made meanwhile may be this very version, or a newer one
                        await self._catch_up()
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
        local = {key: self._running_raw[key] for key in RESTART_ONLY if key in self._running_raw}
        restored, secret_problems = self._unredact(shared(fleet.raw), self._secrets | self._kept_keys.refreshed())
        raw = restored | local
        try:
            config = check_edit(raw, self._rules, secret_problems=secret_problems, keeping_admin=None)
            self._apply(config, raw)
        except ConfigError as exc:
            self._refused = number
            self._troubles["fleet"] = (
                f"config version {number} from another gateway process cannot run here ({len(exc.problems)} "
                f"problem(s) at {_paths([path for path, _ in exc.problems])}); version {self.current.version} "
                "keeps running"
            )
            log.error("%s: %s", self._troubles["fleet"], _problem_list(exc))
            return
        version = ConfigVersion(
            number, fleet.applied_at, fleet.author, redact(raw), fleet.diff, self._file_sha, self._file_raw
        )
        self._record(version)
        self._kept_keys.keep(known_keys(raw), self._file_keys)
        self._troubles.pop("fleet", None)
        log.warning(
            "config version %d adopted from another gateway process (%s): %s",
            number,
            fleet.author,
            change_summary(fleet.diff),
        )
        self._reconcile()


def _from_file(author: str) -> bool:
    """Whether a version with this author was made from the config file itself."""
    return author == "startup" or author.startswith("file")


def _paths(paths: list[str]) -> str:
    shown = ", ".join(paths[:_SHOWN_PATHS])
    return shown + (f" and {len(paths) - _SHOWN_PATHS} more" if len(paths) > _SHOWN_PATHS else "")


def _problem_list(exc: ConfigError) -> str:
    """Every problem as ``path: message``: messages name fields, hosts and variables, never a secret's value."""
    return "; ".join(f"{path}: {message}" for path, message in exc.problems) or str(exc)


def _provider_of(model: str) -> str | None:
    """The litellm provider of ``model``; litellm takes seconds to import, so only a hosted model without an
    ``api_base`` pays for it."""
    from spillgate.backends.hosted.client import provider_of

    return provider_of(model)


def _replica_urls(pool: dict[str, Any]) -> set[str]:
    """The URLs of a raw pool's ``replicas``, however each is written (``url`` or ``{url, name}``)."""
    replicas = pool.get("replicas")
    return {replica_url(r) or str(r) for r in replicas} if isinstance(replicas, list) else set()
