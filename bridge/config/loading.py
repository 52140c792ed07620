"""Reading the file: TOML, then each table through its model, every problem listed at once.

Tables are validated one by one so that a broken one never hides another's problems; checks
across keys of a table run once that table's own keys are valid. A subscription's table is
split between the core's keys (:class:`~bridge.config.model.SubscriptionConfig`) and its
adapter's (found through the ``fencebridge.sources`` entry point its ``source`` names).
"""

from __future__ import annotations

import os
import tomllib
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Generic, TypeVar, cast

from pydantic import ValidationError

from bridge.adapters import sinks, sources
from bridge.adapters.plugins import Plugins
from bridge.config.fields import NAME_RULE, Table, either, name_problem, shown
from bridge.config.model import (
    DECLARED_JOBS,
    BridgeConfig,
    BridgeSettings,
    DestinationConfig,
    JobConfig,
    RetentionConfig,
    SubscriptionConfig,
)
from bridge.config.problems import Scope, Where, did_you_mean, messages
from bridge.database import DATABASE_URL_ENV
from bridge.errors import ConfigError

TOP_LEVEL: Final = ("bridge", "jobs", "subscriptions", "retention", "outbox")
#: the one key refused anywhere in the file: the database URL holds credentials
REFUSED_KEY: Final = "database_url"

T = TypeVar("T", bound=Table)
C = TypeVar("C", SubscriptionConfig, DestinationConfig)


def load_config(path: str | os.PathLike[str]) -> BridgeConfig:
    """Read and check the configuration file; raises ConfigError naming file and key."""
    file = os.fspath(path)
    try:
        with open(file, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ConfigError(f"{file}: cannot be read: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file}: is not UTF-8 text (byte {exc.start})") from None
    return parse_config(text, file=file)


def parse_config(text: str, *, file: str = "<config>") -> BridgeConfig:
    """Check configuration text; ``file`` is the name errors give it.

    Every problem in the file is reported at once (one per line), not only the first.
    """
    where = Where(file)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(where.message(f"invalid TOML: {exc}")) from None
    problems: list[str] = []
    document = _without_secrets(raw, where, problems)
    for name in document:
        if name not in TOP_LEVEL:
            hint = did_you_mean(
                name, TOP_LEVEL, "expected [bridge], [jobs.<name>] or [subscriptions.<name>]"
            )
            problems.append(where.child(name).message(f"unknown section; {hint}"))
    report = problems.extend
    settings = _table(BridgeSettings, document.get("bridge", {}), where.child("bridge"), report)
    jobs: dict[str, JobConfig] = {}
    for name, table in _named(document, "jobs", "job type", where, report).items():
        job = _table(JobConfig, table, where.child("jobs").child(name), report, name=name)
        if job is not None:
            jobs[name] = job
    # a job type that is declared but invalid is reported once, not again by each user of it
    section = document.get("jobs")
    declared = frozenset(section) if isinstance(section, dict) and section else None
    subscriptions: dict[str, SubscriptionConfig] = {}
    for name, table in _named(document, "subscriptions", "subscription", where, report).items():
        at = where.child("subscriptions").child(name)
        sub = _split(SUBSCRIPTIONS, name, table, at, report, context={DECLARED_JOBS: declared})
        if sub is not None:
            subscriptions[name] = sub
    _shadows_read_copies(subscriptions, where, report)
    retention = None
    if "retention" in document:
        retention = _table(RetentionConfig, document["retention"], where.child("retention"), report)
    outbox = _outbox(document, where, report)
    if problems:
        raise ConfigError("\n".join(problems))
    assert settings is not None  # no problem was found, so every table was built
    for sub in subscriptions.values():
        sub.with_bridge_quota(settings.tenant_backlog_quota)
    return BridgeConfig(
        bridge=settings,
        jobs=types.MappingProxyType(jobs),
        subscriptions=types.MappingProxyType(subscriptions),
        retention=retention,
        outbox=types.MappingProxyType(outbox),
        file=file,
    )


Report = Callable[[list[str]], None]


def _shadows_read_copies(
    subscriptions: Mapping[str, SubscriptionConfig], where: Where, report: Report
) -> None:
    """A shadow subscription reading a live one's queue would take its messages away."""
    live = {
        (s.source, s.settings.address()): name
        for name, s in subscriptions.items()
        if not s.shadow and s.settings.address() is not None
    }
    for name, sub in subscriptions.items():
        other = live.get((sub.source, sub.settings.address())) if sub.shadow else None
        if other is not None:
            report(
                [
                    where.child("subscriptions")
                    .child(name)
                    .message(
                        f"a shadow subscription reads {sub.settings.address()}, which the live "
                        f"subscription {other!r} reads: shadow a copy of the stream (an SNS "
                        "fan-out to its own queue, a second Pub/Sub subscription)"
                    )
                ]
            )


def _table(
    model: type[T], raw: object, where: Where, report: Report, *, name: str = ""
) -> T | None:
    try:
        return model.read(raw, name=name)
    except ValidationError as exc:
        report(messages([(model, exc)], where))
        return None


def _without_secrets(node: Any, where: Where, problems: list[str]) -> Any:
    """The document without any ``database_url`` key, each one reported without its value."""
    if isinstance(node, dict):
        kept = {}
        for key, value in node.items():
            if key.lower() == REFUSED_KEY:
                problems.append(
                    where.child(key).message(
                        "secrets are never read from the configuration file; remove this key "
                        f"and set {DATABASE_URL_ENV} in the environment"
                    )
                )
            else:
                kept[key] = _without_secrets(value, where.child(key), problems)
        return kept
    if isinstance(node, list):
        return [_without_secrets(v, where.child(i), problems) for i, v in enumerate(node)]
    return node


def _named(
    document: dict[str, Any], section: str, what: str, where: Where, report: Report
) -> dict[str, Any]:
    """The section's tables by name; problems are listed and the bad tables left out."""
    tables = document.get(section)
    key = where.child(section)
    if tables is None or tables == {}:
        report([key.message(f"at least one {what} is required, as [{section}.<name>]")])
        return {}
    if not isinstance(tables, dict):
        report([key.message(f"expected tables [{section}.<name>], got {shown(tables)}")])
        return {}
    named: dict[str, Any] = {}
    for name, table in tables.items():
        if name_problem(name) is None:
            named[name] = table
        else:
            report([key.child(name).message(f"a {what} name is {NAME_RULE}")])
    return named


def read_destination(
    name: str, table: Mapping[str, Any], *, file: str = "<config>"
) -> DestinationConfig:
    """One ``[outbox.<name>]`` table, its sink's keys included, as the file's reader checks
    it (for code that builds a relay without a file); ConfigError lists every problem."""
    problems: list[str] = []
    found = _outbox({"outbox": {name: dict(table)}}, Where(file), problems.extend)
    if problems:
        raise ConfigError("\n".join(problems))
    return found[name]


def _outbox(document: dict[str, Any], where: Where, report: Report) -> dict[str, DestinationConfig]:
    """The outbox destinations, ``[outbox.<name>]``; none is required."""
    tables = document.get("outbox")
    if tables is None:
        return {}
    at = where.child("outbox")
    if not isinstance(tables, dict):
        report([at.message(f"expected tables [outbox.<name>], got {shown(tables)}")])
        return {}
    found: dict[str, DestinationConfig] = {}
    for name, table in tables.items():
        if name_problem(name) is not None:
            report([at.child(name).message(f"an outbox destination name is {NAME_RULE}")])
            continue
        destination = _split(DESTINATIONS, name, table, at.child(name), report)
        if destination is None:
            continue
        problem = destination.settings.address_problem(destination.address)
        if problem is not None:
            report([at.child(name).child("address").message(problem)])
            continue
        found[name] = destination
    return found


@dataclass(frozen=True, slots=True)
class _Split(Generic[C]):
    """A kind of table whose keys are split between the core's model and a plugin's: the
    plugin is named by ``key`` and found in ``plugins``; its ``settings`` model holds the rest
    of the table."""

    core: type[C]
    #: the registry, looked up when a table is read: the plugin modules import this package
    registry: Callable[[], Plugins[Any]]
    key: str
    table: str


SUBSCRIPTIONS: Final = _Split(SubscriptionConfig, lambda: sources.SOURCES, "source", "subscription")
DESTINATIONS: Final = _Split(DestinationConfig, lambda: sinks.SINKS, "sink", "destination")


def _split(
    kind: _Split[C],
    name: str,
    raw: object,
    where: Where,
    report: Report,
    *,
    context: dict[str, Any] | None = None,
) -> C | None:
    """The core's keys and the plugin's, validated side by side and reported together."""
    if not isinstance(raw, dict):
        report([where.message(f"expected a table, got {shown(raw)}")])
        return None
    plugins = kind.registry()
    installed = plugins.names()
    expected = either([repr(n) for n in installed]) if installed else f"an installed {kind.key}"
    if kind.key not in raw:
        report([where.child(kind.key).message(f"required key is missing; expected {expected}")])
        return None
    plugin = raw[kind.key]
    if not isinstance(plugin, str) or plugin not in installed:
        report([where.child(kind.key).message(f"expected {expected}, got {shown(plugin)}")])
        return None
    settings_model: type[Table] = plugins.get(plugin).settings
    core: tuple[str, ...] = tuple(kind.core.model_fields)
    own: tuple[str, ...] = tuple(settings_model.model_fields)
    failed: list[tuple[type[Table], ValidationError]] = []
    table: C | None = None
    settings: Table | None = None
    try:
        table = kind.core.read(
            {k: v for k, v in raw.items() if k in core}, name=name, context=context
        )
    except ValidationError as exc:
        failed.append((kind.core, exc))
    try:
        settings = settings_model.read({k: v for k, v in raw.items() if k not in core}, name=name)
    except ValidationError as exc:
        failed.append((settings_model, exc))
    if failed or table is None or settings is None:
        scope = Scope(
            known=(*core, *own),
            plugin=plugin,
            owned=frozenset(own),
            elsewhere=partial(_owner, plugins, plugin),
            key=kind.key,
            table=kind.table,
        )
        report(messages(failed, where, scope))
        return None
    attached: C = cast(Any, table).with_settings(settings)  # the plugin's own settings model
    return attached


def _owner(plugins: Plugins[Any], plugin: str, key: str) -> str | None:
    """Another installed plugin whose settings declare ``key``, for a key set in the wrong
    place."""
    for other in plugins.names():
        if other == plugin:
            continue
        try:
            owned = plugins.get(other).settings.model_fields
        except (ConfigError, ImportError):
            continue  # a plugin that cannot be imported cannot claim the key
        if key in owned:
            return other
    return None
