"""Every problem of a proposed config, from every check, in one answer.

A live edit (the admin API, the file, another process) goes through these checks, each reporting by field path:
the restored secrets (done by the caller), the schema (pydantic, registered policy and engine names included),
where the config may send requests and secrets (:mod:`egress`), start-up settings, cross-references, the admin
key the change was made with, and what building the backends finds (a hosted model litellm cannot place or
price, a missing environment variable), once names resolve.

The checks that need a parsed config run even when the schema failed, on the document with each failing field
set aside (its default stands in) and each entry of ``pools``, ``hosted_models``, ``routes`` or ``tenants`` that
cannot be read field by field standing in by its name alone. What they find inside such an entry is left out,
as it may be about the stand-in rather than what was sent, except a name that resolves to nothing (an unknown
target, route or pool), which no other field of the entry changes. Only a document that is not a config at all
(a required section missing or of the wrong type) stops them. The environment is read (building the backends)
only for an edit whose secrets passed their checks, so a refused edit cannot ask whether a variable is set.
"""

from __future__ import annotations

import contextlib
import copy
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from spillgate.gateway.control.catalog import Endpoints, build_catalog
from spillgate.gateway.control.config import ConfigError, GatewayConfig, Name, reference_problems
from spillgate.gateway.control.egress import SecretBindings, env_problems, url_problems
from spillgate.gateway.control.secrets import MissingSecret
from spillgate.gateway.tenancy.tenants import resolve_key

Problem = tuple[str, str]

RESTART_ONLY = ("listen", "state", "prefix", "health", "timeouts", "secrets")
"""Settings the gateway takes only at start: an edit may leave them out, and may not change them."""
_ENTRY_SECTIONS = ("pools", "hosted_models", "routes", "tenants")
_NAME_REFERENCE = re.compile(r"^(routes|tenants)\.\d+\.(targets|routes|dedicated_pools)\.\d+$")
_REPAIR_ROUNDS = 3
_NAMES: TypeAdapter[str] = TypeAdapter(Name)


@dataclass(frozen=True)
class EditRules:
    """What an edit is checked against, fixed when the gateway starts."""

    started: GatewayConfig
    """The config at start: its start-up settings and simulators are the ones running."""
    startup_env: frozenset[str]
    """The environment variables the config at start names: those an edit may name unless ``secrets.env`` says."""
    startup_hosts: tuple[str, ...]
    """The hosts the config at start sends to: those an edit may use unless ``secrets.upstream_hosts`` says."""
    bindings: SecretBindings
    endpoints: Endpoints
    """The simulators this process started, for building an edit's backends."""


def check_edit(
    raw: dict[str, Any], rules: EditRules, *, secret_problems: list[Problem], keeping_admin: str | None
) -> GatewayConfig:
    """``raw`` (secrets restored) as a config; :class:`ConfigError` listing every problem of every check, in the
    order above. ``secret_problems`` are those restoring redacted secrets found; ``keeping_admin`` is the digest of
    the admin key an API change was made with, which the config must keep."""
    problems = list(secret_problems)
    config, schema = _schema(raw)
    problems += schema.problems
    egress = _egress_problems(raw, rules)
    problems += egress
    if config is not None:
        references = reference_problems(config)
        derived = restart_problems(rules.started, config) + references + _admin_problems(config, keeping_admin)
        if not references and not secret_problems and not egress:  # building needs names that resolve
            derived += _catalog_problems(config, rules.endpoints)
        problems += [problem for problem in derived if schema.keeps(problem[0])]
    problems = list(dict.fromkeys(problems))
    if problems:
        raise ConfigError.listing(problems, "config: ")
    assert config is not None
    return config


def restart_problems(old: GatewayConfig, new: GatewayConfig) -> list[Problem]:
    """Changes a running gateway cannot make: listed by field, each saying a restart is needed."""
    problems = [
        (name, "takes effect only at start-up; restart the gateway to change it")
        for name in RESTART_ONLY
        if getattr(old, name) != getattr(new, name)
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


def _admin_problems(config: GatewayConfig, keeping_admin: str | None) -> list[Problem]:
    if keeping_admin is None or keeping_admin in admin_digests(config):
        return []
    return [
        (
            "admin.keys",
            "must keep the admin key this change was made with: without it the admin API would refuse every call "
            "from it, rollback included (a key is removed by another admin key, or in the file)",
        )
    ]


def _egress_problems(raw: dict[str, Any], rules: EditRules) -> list[Problem]:
    """Variables the config may not read, hosts it may not send to, secrets sent somewhere new. ``secrets`` is a
    start-up setting, so the one at start decides (a change to it is refused as such)."""
    allowed = rules.started.secrets
    env = allowed.env if allowed.env is not None else rules.startup_env
    hosts = allowed.upstream_hosts if allowed.upstream_hosts is not None else rules.startup_hosts
    problems = env_problems(raw, env)
    problems += url_problems(raw, hosts, default=allowed.upstream_hosts is None)
    return problems + rules.bindings.problems(raw)


def _catalog_problems(config: GatewayConfig, endpoints: Endpoints) -> list[Problem]:
    """What building the config's backends finds, built apart from the running ones (which it must not touch)."""
    try:
        build_catalog(config, endpoints, {})
    except ConfigError as exc:
        return exc.problems or [("(config)", str(exc))]
    except MissingSecret as exc:
        return [("(config)", str(exc))]
    return []


@dataclass
class _Schema:
    """The schema's problems, and where the document was mended to run the other checks."""

    problems: list[Problem] = field(default_factory=list)
    set_aside: set[str] = field(default_factory=set)
    """Entries (``routes.0``, ``limits``) with a field set aside."""
    stand_ins: set[str] = field(default_factory=set)
    """Entries replaced by a stand-in with their name alone."""

    def keeps(self, path: str) -> bool:
        """Whether another check's problem at ``path`` is about what was sent rather than a stand-in."""
        entry = _entry(path)
        if entry in self.stand_ins:
            return False
        return entry not in self.set_aside or bool(_NAME_REFERENCE.match(path))


def _schema(raw: dict[str, Any]) -> tuple[GatewayConfig | None, _Schema]:
    try:
        return GatewayConfig.model_validate(raw), _Schema()
    except ValidationError as exc:
        errors = exc.errors()
    schema = _Schema([(".".join(str(p) for p in e["loc"]) or "(top level)", e["msg"]) for e in errors])
    document = copy.deepcopy(raw)
    for _ in range(_REPAIR_ROUNDS):
        if not all(_set_aside(document, tuple(error["loc"]), schema) for error in errors):
            return None, schema
        try:
            return GatewayConfig.model_validate(document), schema
        except ValidationError as exc:
            errors = exc.errors()
    return None, schema


def _entry(path: str) -> str:
    parts = path.split(".")
    if parts[0] in _ENTRY_SECTIONS and len(parts) > 1 and parts[1].isdigit():
        return f"{parts[0]}.{parts[1]}"
    return parts[0]


def _set_aside(document: dict[str, Any], loc: tuple[Any, ...], schema: _Schema) -> bool:
    """Mend ``document`` where ``loc`` failed: drop the deepest field along it that the document has (its default
    stands in), or replace the entry holding it by a stand-in; ``False`` when neither can be done."""
    entry = _entry(".".join(str(p) for p in loc))
    parent: Any = None
    key: Any = None
    node: Any = document
    for part in loc:
        if not _holds(node, part):
            break
        parent, key, node = node, part, node[part]
    if isinstance(parent, dict) and not (parent is document and key in _ENTRY_SECTIONS):
        del parent[key]
        schema.set_aside.add(entry)
        return True
    section = document.get(loc[0]) if loc and isinstance(loc[0], str) else None
    if len(loc) >= 2 and loc[0] in _ENTRY_SECTIONS and _holds(section, loc[1]):
        section[loc[1]] = _stand_in(loc[0], loc[1], section[loc[1]])
        schema.stand_ins.add(entry)
        return True
    return False


def _holds(node: object, part: object) -> bool:
    """Whether ``node`` (a mapping or a list) has ``part`` (a key or an index)."""
    if isinstance(node, dict):
        return isinstance(part, str) and part in node
    return isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)


def _stand_in(section: str, index: int, entry: object) -> dict[str, Any]:
    """A valid entry with ``entry``'s name (and a route's aliases), so names elsewhere still resolve to it."""
    given = entry if isinstance(entry, dict) else {}
    name = given.get("name") if _is_name(given.get("name")) else f"stand-in.{section}.{index}"
    if section == "pools":
        return {"name": name, "served_model": "stand-in", "replicas": ["http://127.0.0.1:9"]}
    if section == "hosted_models":
        return {"name": name, "model": "openai/gpt-4o", "input_per_mtok": 0, "output_per_mtok": 0}
    if section == "routes":
        aliases = given.get("aliases") if isinstance(given.get("aliases"), list) else []
        return {"name": name, "aliases": [a for a in aliases if _is_name(a)], "targets": [name]}
    return {"name": name, "keys": [f"sk-stand-in-{index:06d}"], "routes": []}


def _is_name(value: object) -> bool:
    try:
        _NAMES.validate_python(value)
    except ValidationError:
        return False
    return True
