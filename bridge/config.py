"""The bridge's configuration: one TOML file, read into frozen dataclasses and checked whole.

Every key is declared once, as a dataclass field whose metadata holds its documentation, its
type and range, its default and the broker it belongs to. The same declaration reads the file,
rejects what is wrong and writes the reference (:func:`reference_markdown`, published as
``docs/configuration.md``; regenerate it with ``python -m bridge.config``), so the documentation
cannot drift from what is enforced.

Errors are :class:`~bridge.errors.ConfigError` naming the file, the dotted key and the problem::

    bridge.toml: subscriptions.refunds.decode.tenant_id: expected 'attribute:NAME',
    'body:/json/pointer' or 'value:TEXT', got 'tenant'

Every problem in the file is reported at once, one per line; checks across keys of a table
(a job type a subscription names, say) run once that table's own keys read cleanly.
Unknown keys are errors (a typo must not silently fall back to a default), and secrets never
come from the file: a ``database_url`` key anywhere is refused in favour of the environment.
"""

from __future__ import annotations

import difflib
import enum
import inspect
import json
import keyword
import math
import os
import re
import socket
import sys
import tomllib
import types
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import MISSING, Field, dataclass, field, fields
from datetime import timedelta
from typing import Any, Final, Protocol

from bridge.database import (
    DATABASE_URL_ENV,
    IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT,
    LOCK_TIMEOUT_DEFAULT,
    STATEMENT_TIMEOUT_DEFAULT,
    SessionTimeouts,
)
from bridge.decode import (
    REASONS,
    RULES_MARKDOWN,
    DecodeRules,
    FieldSource,
    JobRule,
    PayloadSource,
    SourceKind,
    identifier_problem,
)
from bridge.errors import ConfigError
from bridge.service import (
    UNHEALTHY_AFTER_RESTARTS_DEFAULT,
    UNHEALTHY_AFTER_SECONDS_DEFAULT,
    Limits,
)
from bridge.types import TargetClass

WORKER_THREADS_DEFAULT: Final = 8
CLAIM_BATCH_DEFAULT: Final = 10
POLL_INTERVAL_SECONDS_DEFAULT: Final = 1.0
SWEEP_INTERVAL_SECONDS_DEFAULT: Final = 15.0
SHUTDOWN_DEADLINE_SECONDS_DEFAULT: Final = 30.0
HEALTH_HOST_DEFAULT: Final = "127.0.0.1"
HEALTH_PORT_DEFAULT: Final = 8080

MAX_ATTEMPTS_DEFAULT: Final = 5
#: class D targets have neither fence nor idempotency key: one attempt, ever
MAX_ATTEMPTS_CLASS_D: Final = 1
LEASE_SECONDS_DEFAULT: Final = 60.0
BACKOFF_INITIAL_SECONDS_DEFAULT: Final = 1.0
BACKOFF_MAX_SECONDS_DEFAULT: Final = 300.0

RECEIVE_BATCH_DEFAULT: Final = 10
WAIT_SECONDS_DEFAULT: Final = 20
VISIBILITY_TIMEOUT_SECONDS_DEFAULT: Final = 60
#: the largest SQS message (1 MiB); Pub/Sub allows up to 10 MB
MAX_BODY_BYTES_DEFAULT: Final = 1_048_576
CONSUMERS_DEFAULT: Final = 1
FLOW_MAX_MESSAGES_DEFAULT: Final = 1000
FLOW_MAX_BYTES_DEFAULT: Final = 100 * 1024 * 1024
#: google-cloud-pubsub's own default for ``FlowControl.max_lease_duration``
FLOW_MAX_LEASE_DURATION_SECONDS_DEFAULT: Final = 3600
BATCH_MAX_MESSAGES_DEFAULT: Final = 100
BATCH_MAX_WAIT_MS_DEFAULT: Final = 50

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_NAME_RULE = "1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit"
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_REGION = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
_PUBSUB_SUBSCRIPTION = re.compile(r"projects/[^/\s]+/subscriptions/[^/\s]+")
#: the one key refused anywhere in the file: the database URL holds credentials
_REFUSED_KEY = "database_url"


class Source(enum.StrEnum):
    """The broker a subscription reads from."""

    SQS = "sqs"
    PUBSUB = "pubsub"


class AckMode(enum.StrEnum):
    """When a delivery is acknowledged to its broker."""

    AFTER_INBOX = "after_inbox"  #: once its work row has committed
    AFTER_OUTCOME = "after_outcome"  #: once its work row is terminal or parked


ACK_MODE_DEFAULT: Final = AckMode.AFTER_INBOX


# -- how a key is read, checked and documented ------------------------------------------------


class _Reported(ConfigError):  # noqa: N818  (a signal inside the reader, never shown)
    """A table whose problems are already listed: stop building it, add nothing more."""


class _Problems:
    """Every problem found in one file, so that one pass of fixes is enough."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def add(self, error: ConfigError) -> None:
        if not isinstance(error, _Reported):
            self.messages.append(str(error))

    @contextmanager
    def collect(self) -> Iterator[None]:
        """Record a ConfigError raised inside instead of letting it end the reading."""
        try:
            yield
        except ConfigError as exc:
            self.add(exc)

    def raise_if_any(self) -> None:
        if len(self.messages) == 1:
            raise ConfigError(self.messages[0])
        if self.messages:
            raise ConfigError("\n".join(self.messages))


@dataclass(frozen=True, slots=True)
class _At:
    """Where in the file a value sits, so that every error can name it."""

    file: str
    key: str = ""
    problems: _Problems = field(default_factory=_Problems, compare=False, repr=False)

    def child(self, name: str) -> _At:
        part = name if _BARE_KEY.fullmatch(name) else json.dumps(name)
        return _At(self.file, f"{self.key}.{part}" if self.key else part, self.problems)

    def index(self, position: int) -> _At:
        return _At(self.file, f"{self.key}[{position}]", self.problems)

    def error(self, problem: str) -> ConfigError:
        where = f"{self.key}: " if self.key else ""
        return ConfigError(f"{self.file}: {where}{problem}")


def _shown(raw: object) -> str:
    """A TOML value as an error message shows it."""
    if isinstance(raw, bool):
        return "true" if raw else "false"
    if isinstance(raw, str):
        text = repr(raw)
        return text if len(text) <= 80 else f"{text[:76]}...{text[0]}"
    if isinstance(raw, int | float):
        return repr(raw)
    if isinstance(raw, dict):
        return "a table"
    if isinstance(raw, list):
        return "an array"
    return f"a {type(raw).__name__}"


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _either(names: list[str]) -> str:
    """``a, b or c``: the alternatives an error or the reference offers."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def _did_you_mean(name: str, known: list[str], otherwise: str) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f"did you mean {close[0]!r}?" if close else otherwise


class _Value(Protocol):
    """A key's type and range: reads a TOML value, and describes itself for the reference."""

    def describe(self) -> str: ...

    def read(self, raw: object, at: _At) -> Any: ...


@dataclass(frozen=True, slots=True)
class _Integer:
    minimum: int
    maximum: int

    def describe(self) -> str:
        return f"integer, {self.minimum}..{self.maximum}"

    def read(self, raw: object, at: _At) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise at.error(f"expected an integer, got {_shown(raw)}")
        if not self.minimum <= raw <= self.maximum:
            raise at.error(f"must be from {self.minimum} to {self.maximum}, got {raw}")
        return raw


@dataclass(frozen=True, slots=True)
class _Number:
    minimum: float
    maximum: float
    #: the minimum itself is not allowed (a duration that must be positive)
    above_minimum: bool = False

    def describe(self) -> str:
        low, high = _number_text(self.minimum), _number_text(self.maximum)
        if self.above_minimum:
            return f"number, > {low} and ≤ {high}"
        return f"number, {low}..{high}"

    def read(self, raw: object, at: _At) -> float:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise at.error(f"expected a number, got {_shown(raw)}")
        value = float(raw)
        too_low = value <= self.minimum if self.above_minimum else value < self.minimum
        if not math.isfinite(value) or too_low or value > self.maximum:
            low = "more than" if self.above_minimum else "from"
            bounds = f"{low} {_number_text(self.minimum)} to {_number_text(self.maximum)}"
            raise at.error(f"must be {bounds}, got {_shown(raw)}")
        return value


@dataclass(frozen=True, slots=True)
class _Boolean:
    def describe(self) -> str:
        return "boolean"

    def read(self, raw: object, at: _At) -> bool:
        if not isinstance(raw, bool):
            raise at.error(f"expected true or false, got {_shown(raw)}")
        return raw


@dataclass(frozen=True, slots=True)
class _Text:
    #: what the reference says the value is
    what: str
    #: the problem with a string, or None; never repeats a value that could be secret
    check: Callable[[str], str | None]

    def describe(self) -> str:
        return self.what

    def read(self, raw: object, at: _At) -> str:
        if not isinstance(raw, str):
            raise at.error(f"expected a string, got {_shown(raw)}")
        problem = self.check(raw)
        if problem:
            raise at.error(problem)
        return raw


@dataclass(frozen=True, slots=True)
class _Choice:
    choices: type[enum.StrEnum]

    def _spelled(self, quote: str) -> str:
        return _either([f"{quote}{c.value}{quote}" for c in self.choices])

    def describe(self) -> str:
        return self._spelled("`")

    def read(self, raw: object, at: _At) -> enum.StrEnum:
        if isinstance(raw, str):
            for choice in self.choices:
                if raw == choice.value:
                    return choice
        raise at.error(f"expected {self._spelled(chr(39))}, got {_shown(raw)}")


@dataclass(frozen=True, slots=True)
class _Strings:
    item: _Text
    #: what the reference says the elements are
    what: str
    #: at least one element
    required: bool

    def describe(self) -> str:
        return f"array of {self.what}{', not empty' if self.required else ''}"

    def read(self, raw: object, at: _At) -> tuple[str, ...]:
        if not isinstance(raw, list):
            raise at.error(f"expected an array of strings, got {_shown(raw)}")
        if self.required and not raw:
            raise at.error("must list at least one")
        items = tuple(self.item.read(v, at.index(i)) for i, v in enumerate(raw))
        for i, value in enumerate(items):
            if value in items[:i]:
                raise at.index(i).error(f"{value!r} is listed twice")
        return items


_SPELLING: Final[Mapping[SourceKind, str]] = {
    SourceKind.ATTRIBUTE: "attribute:NAME",
    SourceKind.BODY: "body:/json/pointer",
    SourceKind.VALUE: "value:TEXT",
    SourceKind.MESSAGE_ID: "message_id",
}


def _alternatives(kinds: tuple[SourceKind, ...], quote: str) -> str:
    return _either([f"{quote}{_SPELLING[k]}{quote}" for k in kinds])


@dataclass(frozen=True, slots=True)
class _Sources:
    """A decode field's source: which kinds it may use."""

    allowed: tuple[SourceKind, ...]

    def describe(self) -> str:
        return f"field source: {_alternatives(self.allowed, '`')}"

    def read(self, raw: object, at: _At) -> FieldSource:
        plain = tuple(k for k in self.allowed if k is not SourceKind.MESSAGE_ID)
        expected = f"expected {_alternatives(plain, chr(39))}"
        if not isinstance(raw, str):
            raise at.error(f"{expected}, got {_shown(raw)}")
        prefix, colon, _ = raw.partition(":")
        kind = SourceKind.MESSAGE_ID if raw == SourceKind.MESSAGE_ID else None
        if colon and prefix in (SourceKind.ATTRIBUTE, SourceKind.BODY, SourceKind.VALUE):
            kind = SourceKind(prefix)
        if kind is None:
            raise at.error(f"{expected}, got {_shown(raw)}")
        if kind is SourceKind.VALUE and kind not in self.allowed:
            raise at.error(
                f"a constant operation id would make every delivery one operation; {expected}"
            )
        if kind is SourceKind.MESSAGE_ID and kind not in self.allowed:
            raise at.error(f"'message_id' is a source for operation_id only; {expected}")
        try:
            return FieldSource.parse(raw)
        except ValueError as exc:
            raise at.error(f"{exc}, in {_shown(raw)}") from None


@dataclass(frozen=True, slots=True)
class _Payload:
    def describe(self) -> str:
        return "`body` or `body:/json/pointer`"

    def read(self, raw: object, at: _At) -> PayloadSource:
        if not isinstance(raw, str) or not (raw == "body" or raw.startswith("body:")):
            raise at.error(f"expected 'body' or 'body:/json/pointer', got {_shown(raw)}")
        try:
            return PayloadSource.parse(raw)
        except ValueError as exc:
            raise at.error(f"{exc}, in {_shown(raw)}") from None


@dataclass(frozen=True, slots=True)
class _Table:
    """A nested table (inline or not) read field by field like a section."""

    cls: type[Any]

    def describe(self) -> str:
        return "table"

    def read(self, raw: object, at: _At) -> Any:
        return self.cls(**_read_table(self.cls, raw, at))


@dataclass(frozen=True, slots=True)
class _Spec:
    """Everything about one key: kept in its dataclass field's metadata."""

    doc: str
    value: _Value
    #: the default as the reference shows it, when it is not a plain value
    default_text: str | None = None
    #: the key belongs to subscriptions of this source only
    only: Source | None = None
    #: required (within ``only``'s source) although the field defaults to None
    required: bool = False


_SPEC: Final = "fencebridge.config"


def _key(
    doc: str,
    value: _Value,
    *,
    default_text: str | None = None,
    only: Source | None = None,
    required: bool = False,
) -> dict[str, _Spec]:
    return {_SPEC: _Spec(inspect.cleandoc(doc), value, default_text, only, required)}


def _specs(cls: type[Any]) -> list[tuple[Field[Any], _Spec]]:
    return [(f, f.metadata[_SPEC]) for f in fields(cls) if _SPEC in f.metadata]


def _has_default(f: Field[Any]) -> bool:
    return f.default is not MISSING or f.default_factory is not MISSING


def _read_table(
    cls: type[Any], raw: object, at: _At, *, scope: Source | None = None
) -> dict[str, Any]:
    """The keyword arguments for ``cls`` from one TOML table; defaults are left to ``cls``."""
    if not isinstance(raw, dict):
        raise at.error(f"expected a table, got {_shown(raw)}")
    specs = _specs(cls)
    known = [f.name for f, _ in specs]
    before = len(at.problems.messages)
    failed = False
    meant: set[str] = set()  # keys a typo was taken for: their absence is not a second problem
    for name in raw:
        if name not in known and name.lower() != _REFUSED_KEY:  # refused on its own, once
            meant.update(difflib.get_close_matches(name, known, n=1))
            hint = _did_you_mean(name, known, f"expected one of: {', '.join(known)}")
            at.problems.add(at.child(name).error(f"unknown key; {hint}"))
    values: dict[str, Any] = {}
    for f, spec in specs:
        key = at.child(f.name)
        try:
            if f.name in raw:
                if spec.only is not None and scope is not None and spec.only is not scope:
                    raise key.error(
                        f"applies to source = '{spec.only}' only, and this subscription's "
                        f"source is '{scope}'"
                    )
                values[f.name] = spec.value.read(raw[f.name], key)
            elif not _has_default(f):
                if f.name in meant:
                    failed = True
                    continue
                raise key.error("required key is missing")
            elif spec.required and spec.only is not None and spec.only is scope:
                raise key.error(f"required for source = '{scope}'")
        except ConfigError as exc:
            failed = True
            at.problems.add(exc)
    if failed or len(at.problems.messages) > before:
        raise _Reported(at.key)
    return values


# -- checks of single values ------------------------------------------------------------------


def _clean(text: str) -> str | None:
    if text == "":
        return "must not be empty"
    problem = identifier_problem(text)
    return f"the value {problem}" if problem else None


def _python_name(part: str) -> bool:
    return part.isidentifier() and not keyword.iskeyword(part)


def _import_path(text: str) -> str | None:
    # one attribute of the module: the bridge imports the module and takes that attribute
    module, colon, attribute = text.partition(":")
    names = [*module.split("."), attribute]
    if colon and all(_python_name(n) for n in names):
        return None
    return f"expected an import path 'module.path:attribute', got {_shown(text)}"


def _url(text: str) -> str | None:
    parts = urllib.parse.urlsplit(text) if text.isprintable() and " " not in text else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        return f"expected an http:// or https:// URL, got {_shown(text)}"
    return None


def _region(text: str) -> str | None:
    if _REGION.fullmatch(text):
        return None
    return f"expected an AWS region such as 'eu-west-1', got {_shown(text)}"


def _pubsub_subscription(text: str) -> str | None:
    if _PUBSUB_SUBSCRIPTION.fullmatch(text):
        return None
    return f"expected 'projects/<project>/subscriptions/<id>', got {_shown(text)}"


def _host(text: str) -> str | None:
    if text and text.isprintable() and not any(c.isspace() for c in text):
        return None
    return f"expected a host name or address, got {_shown(text)}"


def _name(text: str) -> str | None:
    return None if _NAME.fullmatch(text) else f"expected {_NAME_RULE}, got {_shown(text)}"


_IDENTIFIER_TEXT: Final = _Text(
    "string, 1..256 characters, no control characters or surrounding whitespace", _clean
)


def default_worker_id() -> str:
    """``<hostname>-<pid>``: unique per process on a host, readable in status output."""
    return f"{socket.gethostname()}-{os.getpid()}"


# -- the sections -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BridgeSettings:
    """Settings of the bridge process. Every key is optional."""

    worker_id: str = field(
        default_factory=default_worker_id,
        metadata=_key(
            """
            Names this process as the lease owner of the rows it claims. Give every running
            process its own: the id is how status output and logs tell claims apart (the
            fence, not this id, is what keeps their writes apart).
            """,
            _IDENTIFIER_TEXT,
            default_text='`"<hostname>-<pid>"`',
        ),
    )
    worker_threads: int = field(
        default=WORKER_THREADS_DEFAULT,
        metadata=_key("Handlers that run at once in this process.", _Integer(1, 256)),
    )
    claim_batch: int = field(
        default=CLAIM_BATCH_DEFAULT,
        metadata=_key("Most work rows one claim statement leases.", _Integer(1, 1000)),
    )
    poll_interval_seconds: float = field(
        default=POLL_INTERVAL_SECONDS_DEFAULT,
        metadata=_key(
            "Pause between claims while the last claim found nothing to do.",
            _Number(0, 3600, above_minimum=True),
        ),
    )
    sweep_interval_seconds: float = field(
        default=SWEEP_INTERVAL_SECONDS_DEFAULT,
        metadata=_key(
            """
            How often the sweeper looks for claims whose lease expired with no attempt left
            and parks them as `unknown`.
            """,
            _Number(0, 3600, above_minimum=True),
        ),
    )
    shutdown_deadline_seconds: float = field(
        default=SHUTDOWN_DEADLINE_SECONDS_DEFAULT,
        metadata=_key(
            """
            On SIGTERM, how long running handlers get to finish. A claim still open after it
            is left to lease expiry; its fence keeps any late write out.
            """,
            _Number(0, 3600),
        ),
    )
    statement_timeout_seconds: float = field(
        default=STATEMENT_TIMEOUT_DEFAULT.total_seconds(),
        metadata=_key(
            """
            Longest any one statement of the bridge may run (PostgreSQL's `statement_timeout`
            on every pooled connection). Past it the server cancels the statement and rolls it
            back: the caller gets a clear error, nothing was applied, and the work is retried
            the way a database outage is. A class A transaction uses the handler's deadline
            instead. `0` leaves the server's setting.
            """,
            _Number(0, 86400),
        ),
    )
    lock_timeout_seconds: float = field(
        default=LOCK_TIMEOUT_DEFAULT.total_seconds(),
        metadata=_key(
            """
            Longest a statement of the bridge waits for a row or table lock (`lock_timeout`),
            including a class A handler's business rows. A wait that long means something else
            holds the lock; the statement is rolled back and retried later instead of queueing
            behind it. `0` leaves the server's setting.
            """,
            _Number(0, 86400),
        ),
    )
    idle_in_transaction_timeout_seconds: float = field(
        default=IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT.total_seconds(),
        metadata=_key(
            """
            Longest a connection of the bridge may sit idle inside an open transaction
            (`idle_in_transaction_session_timeout`). Past it the server ends the session, which
            rolls the transaction back and releases every lock it held: a handler stuck in a
            call can never hold rows and a connection forever. A class A transaction uses the
            handler's deadline instead. `0` leaves the server's setting.
            """,
            _Number(0, 86400),
        ),
    )
    unhealthy_after_seconds: float = field(
        default=UNHEALTHY_AFTER_SECONDS_DEFAULT,
        metadata=_key(
            """
            How long a service of the bridge (claimer, workers, heartbeater, sweeper...) may
            keep failing before `/healthz` fails too, so the orchestrator restarts the process.
            Until then only `/readyz` fails. A dependency that cannot be reached at all never
            fails `/healthz`: a restart would not bring it back.
            """,
            _Number(1, 86400),
        ),
    )
    unhealthy_after_restarts: int = field(
        default=UNHEALTHY_AFTER_RESTARTS_DEFAULT,
        metadata=_key(
            "Restarts in a row of one service, without a good round between them, after which"
            " `/healthz` fails.",
            _Integer(1, 1_000_000),
        ),
    )
    health_host: str = field(
        default=HEALTH_HOST_DEFAULT,
        metadata=_key(
            "Address the health endpoint listens on.", _Text("string, host name or address", _host)
        ),
    )
    health_port: int = field(
        default=HEALTH_PORT_DEFAULT,
        metadata=_key(
            "Port of `/healthz` (liveness) and `/readyz` (readiness); `0` disables both.",
            _Integer(0, 65535),
        ),
    )

    def limits(self) -> Limits:
        """When a failing service makes the process unhealthy, not only unready."""
        return Limits(
            failing_seconds=self.unhealthy_after_seconds, restarts=self.unhealthy_after_restarts
        )

    def session_timeouts(self) -> SessionTimeouts:
        """The limits every pooled connection of the bridge starts with."""

        def limit(seconds: float) -> timedelta | None:
            return timedelta(seconds=seconds) if seconds > 0 else None

        return SessionTimeouts(
            statement=limit(self.statement_timeout_seconds),
            lock=limit(self.lock_timeout_seconds),
            idle_in_transaction=limit(self.idle_in_transaction_timeout_seconds),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class JobConfig:
    """One table per job type. `<name>` is the job type a delivery decodes to (1 to 64 letters,
    digits, `_`, `.` or `-`, starting with a letter or digit); subscriptions list the job
    types they accept in `job_types`.
    """

    #: the job type, from the table's name
    name: str
    handler: str = field(
        metadata=_key(
            """
            The handler, as an import path `module.path:attribute`. Only the spelling is
            checked when the file is read; the bridge imports it when it starts.
            """,
            _Text("string, `module.path:attribute`", _import_path),
        )
    )
    target_class: TargetClass = field(
        metadata=_key(
            """
            Where the handler's side effect lands, which decides what the fence can
            guarantee. `A`: the same PostgreSQL database as the work table; the business
            write commits with the settlement, under the fence. `B`: a store with conditional
            writes that keeps the last fence and refuses lower ones. `C`: an external API with
            an idempotency key and a lookup by key; after an ambiguous attempt the bridge looks
            the key up before acting again (dedupe, not fencing). `D`: none of these; at most
            one attempt, its intent recorded first, and an ambiguous result is parked as
            `unknown`. There is no default: the class is a statement about the target that
            only its owner can make.
            """,
            _Choice(TargetClass),
        )
    )
    max_attempts: int = field(
        default=MAX_ATTEMPTS_DEFAULT,
        metadata=_key(
            """
            Claims a row may take. With none left, a retryable failure becomes
            `failed_terminal`, and a claim whose lease expires is parked as `unknown`: never
            retried, never assumed failed. Class `D` allows exactly one: leave the key out or
            set it to 1.
            """,
            _Integer(1, 100),
            default_text=f"`{MAX_ATTEMPTS_DEFAULT}` (class `D`: `{MAX_ATTEMPTS_CLASS_D}`)",
        ),
    )
    lease_seconds: float = field(
        default=LEASE_SECONDS_DEFAULT,
        metadata=_key(
            """
            Length of a claim's lease. It is liveness only: heartbeats renew it while the
            handler reports progress, and once it lapses another worker may take the row over
            under a higher fence, which refuses every later write of the first one.
            """,
            _Number(0, 86400, above_minimum=True),
        ),
    )
    backoff_initial_seconds: float = field(
        default=BACKOFF_INITIAL_SECONDS_DEFAULT,
        metadata=_key(
            """
            Delay before the first retry after a retryable failure; later retries wait longer
            (exponential backoff), up to `backoff_max_seconds`.
            """,
            _Number(0, 86400),
        ),
    )
    backoff_max_seconds: float = field(
        default=BACKOFF_MAX_SECONDS_DEFAULT,
        metadata=_key(
            "Longest retry delay; at least `backoff_initial_seconds`.", _Number(0, 86400)
        ),
    )
    owner: str | None = field(
        default=None,
        metadata=_key(
            """
            Who owns this job type's parked and failed rows (`unknown`, `quarantined`,
            `failed_terminal`): a team or on-call rotation, named where alerts are routed.
            `fencebridge check` reports no-go for a job type without one.
            """,
            _IDENTIFIER_TEXT,
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowControl:
    """Pub/Sub streaming-pull flow control (the client library's `FlowControl`): how much may
    be received and not yet acknowledged at once. Written inline, e.g.
    `flow_control = { max_messages = 1000 }`.
    """

    max_messages: int = field(
        default=FLOW_MAX_MESSAGES_DEFAULT,
        metadata=_key("Most messages outstanding at once.", _Integer(1, 100_000)),
    )
    max_bytes: int = field(
        default=FLOW_MAX_BYTES_DEFAULT,
        metadata=_key("Most bytes outstanding at once.", _Integer(1024, 10 * 1024**3)),
    )
    max_lease_duration_seconds: int = field(
        default=FLOW_MAX_LEASE_DURATION_SECONDS_DEFAULT,
        metadata=_key(
            """
            Longest the client keeps extending a message's ack deadline. With
            `ack_mode = "after_outcome"`, a delivery held longer is redelivered; its work row
            is untouched and the redelivery is a replay.
            """,
            _Integer(10, 86400),
        ),
    )


_DECODE_SOURCES: Final = (SourceKind.ATTRIBUTE, SourceKind.BODY, SourceKind.VALUE)


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeConfig:
    """How a delivery becomes an operation: where each part of its identity is read, and
    which bytes are its payload. Field sources and the decoding rules are described below;
    whatever cannot be read with confidence is quarantined with a reason, never guessed.
    """

    tenant_id: FieldSource = field(
        metadata=_key(
            """
            The tenant, part of every key. `value:` suits a subscription that carries one
            tenant's traffic only.
            """,
            _Sources(_DECODE_SOURCES),
        )
    )
    operation_id: FieldSource = field(
        metadata=_key(
            """
            The operation's identity, from the producer's business intent (the refund request
            id): never a timestamp, a retry counter or a constant, so `value:` is refused.
            `message_id` needs `operation_id_from_message_id = true`.
            """,
            _Sources((SourceKind.ATTRIBUTE, SourceKind.BODY, SourceKind.MESSAGE_ID)),
        )
    )
    job_type: FieldSource = field(
        metadata=_key(
            """
            The job type; it must be one of the subscription's `job_types`. `value:` suits a
            subscription that carries one job type.
            """,
            _Sources(_DECODE_SOURCES),
        )
    )
    schema_version: FieldSource | None = field(
        default=None,
        metadata=_key(
            """
            The payload's schema version, stored on the work row. Required when
            `schema_versions` is not empty; without a source no version is recorded.
            """,
            _Sources(_DECODE_SOURCES),
        ),
    )
    payload: PayloadSource = field(
        default_factory=PayloadSource,
        metadata=_key(
            """
            The approved payload: the bytes that are hashed (sha256) to bind the operation,
            and stored for the handler. `body` is the raw body, byte for byte, never parsed:
            any format, and one changed byte is a conflict. `body:/pointer` is the canonical
            JSON of the value at that pointer (`body:` alone: the whole document), so a
            producer that reorders keys or changes whitespace still replays instead of
            conflicting.
            """,
            _Payload(),
        ),
    )
    operation_id_from_message_id: bool = field(
        default=False,
        metadata=_key(
            """
            Allows `operation_id = "message_id"`, an explicit opt-in because it is weaker. A
            broker's message id names one send, not one intent: a producer that resends after
            a timeout gets a new message id, so two deliveries of one intent become two
            operations and nothing deduplicates them. An SQS MessageId is stable only across
            redeliveries of the same send (a Pub/Sub message id likewise). Use it only for a
            producer that cannot carry an intent id, and only when a duplicate effect is
            acceptable.
            """,
            _Boolean(),
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class SubscriptionConfig:
    """One table per broker subscription: an SQS queue or a Pub/Sub subscription. `<name>`
    (same rule as job type names) is stored on every work row the subscription creates. Keys
    marked with a source apply to that source only; setting them for the other is an error.
    """

    #: the subscription's name, from the table's name
    name: str
    source: Source = field(
        metadata=_key("The broker: decides which of the keys below apply.", _Choice(Source))
    )
    queue_url: str | None = field(
        default=None,
        metadata=_key(
            "The queue's URL, as `GetQueueUrl` returns it.",
            _Text("string, http:// or https:// URL", _url),
            only=Source.SQS,
            required=True,
        ),
    )
    region: str | None = field(
        default=None,
        metadata=_key(
            "The queue's AWS region.",
            _Text("string, AWS region such as `eu-west-1`", _region),
            only=Source.SQS,
            default_text="the AWS environment (`AWS_REGION`, `AWS_DEFAULT_REGION`, profile)",
        ),
    )
    endpoint_url: str | None = field(
        default=None,
        metadata=_key(
            "Endpoint of a local SQS-compatible server, for development and tests.",
            _Text("string, http:// or https:// URL", _url),
            only=Source.SQS,
            default_text="the AWS endpoint of the region (or `AWS_ENDPOINT_URL`)",
        ),
    )
    subscription: str | None = field(
        default=None,
        metadata=_key(
            """
            The subscription's full path. The emulator is chosen with `PUBSUB_EMULATOR_HOST`,
            which the client library reads itself.
            """,
            _Text("string, `projects/<project>/subscriptions/<id>`", _pubsub_subscription),
            only=Source.PUBSUB,
            required=True,
        ),
    )
    ack_mode: AckMode = field(
        default=ACK_MODE_DEFAULT,
        metadata=_key(
            """
            `after_inbox`: acknowledge once the delivery's work row has committed; the broker
            is only a wake-up signal and retries are the bridge's. `after_outcome`: hold the
            delivery, extend its visibility timeout (SQS) or ack deadline (Pub/Sub) while its
            work row makes progress, and acknowledge once the row is terminal or parked. In
            both modes nothing is acknowledged before the row has committed.
            """,
            _Choice(AckMode),
        ),
    )
    receive_batch: int = field(
        default=RECEIVE_BATCH_DEFAULT,
        metadata=_key(
            "Messages asked for per `ReceiveMessage` call (SQS allows 10 at most).",
            _Integer(1, 10),
            only=Source.SQS,
        ),
    )
    wait_seconds: int = field(
        default=WAIT_SECONDS_DEFAULT,
        metadata=_key(
            "Long-poll wait of `ReceiveMessage`; `0` polls without waiting.",
            _Integer(0, 20),
            only=Source.SQS,
        ),
    )
    visibility_timeout_seconds: int = field(
        default=VISIBILITY_TIMEOUT_SECONDS_DEFAULT,
        metadata=_key(
            """
            Visibility timeout asked for on receive and on every extension of a held delivery
            (`after_outcome`: each extension pushes it this far again, before it runs out).
            """,
            _Integer(1, 43200),
            only=Source.SQS,
        ),
    )
    max_body_bytes: int = field(
        default=MAX_BODY_BYTES_DEFAULT,
        metadata=_key(
            """
            Largest body accepted. A longer one is quarantined (`body_too_large`) before it is
            parsed.
            """,
            _Integer(1, 10 * 1024**2),
        ),
    )
    consumers: int = field(
        default=CONSUMERS_DEFAULT,
        metadata=_key("Receiving loops for this subscription.", _Integer(1, 64)),
    )
    job_types: tuple[str, ...] = field(
        metadata=_key(
            """
            The job types this subscription accepts; each needs its `[jobs.<name>]` table. A
            delivery that decodes to another job type is quarantined (`unknown_job_type`).
            """,
            _Strings(_Text("job type name", _name), "job type names", required=True),
        )
    )
    schema_versions: tuple[str, ...] = field(
        default=(),
        metadata=_key(
            """
            The schema versions this subscription accepts. Empty: no check. Otherwise
            `decode.schema_version` is required and other versions are quarantined
            (`unknown_schema_version`).
            """,
            _Strings(_IDENTIFIER_TEXT, "strings, 1..256 characters each", required=False),
        ),
    )
    flow_control: FlowControl = field(
        default_factory=FlowControl,
        metadata=_key(
            "Streaming-pull flow control; its keys are listed below.",
            _Table(FlowControl),
            only=Source.PUBSUB,
            default_text="as listed below",
        ),
    )
    batch_max_messages: int = field(
        default=BATCH_MAX_MESSAGES_DEFAULT,
        metadata=_key(
            """
            Pub/Sub hands messages over one at a time; the bridge gathers them into inbox
            transactions of at most this many.
            """,
            _Integer(1, 1000),
            only=Source.PUBSUB,
        ),
    )
    batch_max_wait_ms: int = field(
        default=BATCH_MAX_WAIT_MS_DEFAULT,
        metadata=_key(
            "Longest a received message waits for its inbox batch to fill.",
            _Integer(0, 10_000),
            only=Source.PUBSUB,
        ),
    )
    decode: DecodeConfig = field(
        metadata=_key(
            "The decoding rules, `[subscriptions.<name>.decode]`; keys listed below.",
            _Table(DecodeConfig),
        )
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionConfig:
    """How long finished work is kept and who answers for deleting it. Optional for running
    the bridge; `fencebridge check` reports no-go without it. `fencebridge purge --config`
    reads the age from here; rows parked as `unknown` or `quarantined` are never purged.
    """

    purge_after_days: int = field(
        metadata=_key(
            """
            Age (since settlement) after which succeeded and failed rows, their payloads and
            resolved rejected deliveries are purged. A delivery redelivered after its row was
            purged is a new operation, so this must be longer than the broker can redeliver
            (SQS keeps messages up to 14 days, Pub/Sub topic retention up to 31);
            `fencebridge check` enforces it per job type.
            """,
            _Integer(1, 36500),
        )
    )
    erasure_owner: str = field(
        metadata=_key(
            """
            Who owns retention and erasure requests for work rows and payloads (a team or
            role): the owner of `fencebridge erase --tenant` and of this plan.
            """,
            _IDENTIFIER_TEXT,
        )
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class BridgeConfig:
    """The whole file: process settings, job types and subscriptions, checked together."""

    bridge: BridgeSettings = field(default_factory=BridgeSettings)
    jobs: Mapping[str, JobConfig]
    subscriptions: Mapping[str, SubscriptionConfig]
    retention: RetentionConfig | None = None
    #: the file it was read from, for messages about it
    file: str = "<config>"

    def decode_rules(self, subscription: str) -> DecodeRules:
        """The subscription's decoding rules, joined with the job types it accepts."""
        sub = self.subscriptions[subscription]
        return DecodeRules(
            subscription=sub.name,
            tenant_id=sub.decode.tenant_id,
            operation_id=sub.decode.operation_id,
            job_type=sub.decode.job_type,
            schema_version=sub.decode.schema_version,
            payload=sub.decode.payload,
            jobs={
                t: JobRule(self.jobs[t].target_class, self.jobs[t].max_attempts)
                for t in sub.job_types
            },
            schema_versions=frozenset(sub.schema_versions),
            max_body_bytes=sub.max_body_bytes,
        )


# -- reading ----------------------------------------------------------------------------------


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
    at = _At(file)
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise at.error(f"invalid TOML: {exc}") from None
    problems = at.problems
    _refuse_secrets(document, at)
    for name in document:
        if name not in _TOP_LEVEL and name.lower() != _REFUSED_KEY:
            hint = _did_you_mean(
                name, _TOP_LEVEL, "expected [bridge], [jobs.<name>] or [subscriptions.<name>]"
            )
            problems.add(at.child(name).error(f"unknown section; {hint}"))
    settings = None
    with problems.collect():
        settings = BridgeSettings(
            **_read_table(BridgeSettings, document.get("bridge", {}), at.child("bridge"))
        )
    jobs: dict[str, JobConfig] = {}
    job_tables = _named_tables(document, "jobs", "job type", at)
    for name, raw in job_tables.items():
        with problems.collect():
            jobs[name] = _job(name, raw, at.child("jobs").child(name))
    # a job type that is declared but invalid is reported once, not again by each user of it
    jobs_section = document.get("jobs")
    declared = set(jobs_section) if isinstance(jobs_section, dict) and jobs_section else None
    subscriptions: dict[str, SubscriptionConfig] = {}
    for name, raw in _named_tables(document, "subscriptions", "subscription", at).items():
        with problems.collect():
            subscriptions[name] = _subscription(
                name, raw, at.child("subscriptions").child(name), declared
            )
    retention = None
    if "retention" in document:
        raw = document["retention"]
        with problems.collect():
            retention = RetentionConfig(**_read_table(RetentionConfig, raw, at.child("retention")))
    problems.raise_if_any()
    assert settings is not None  # no problem was found, so every table was built
    return BridgeConfig(
        bridge=settings,
        jobs=types.MappingProxyType(jobs),
        subscriptions=types.MappingProxyType(subscriptions),
        retention=retention,
        file=file,
    )


_TOP_LEVEL: Final = ["bridge", "jobs", "subscriptions", "retention"]


def _refuse_secrets(node: object, at: _At) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key.lower() == _REFUSED_KEY:
                at.problems.add(
                    at.child(key).error(
                        "secrets are never read from the configuration file; remove this key "
                        f"and set {DATABASE_URL_ENV} in the environment"
                    )
                )
                continue
            _refuse_secrets(value, at.child(key))
    elif isinstance(node, list):
        for position, item in enumerate(node):
            _refuse_secrets(item, at.index(position))


def _named_tables(document: dict[str, Any], section: str, what: str, at: _At) -> dict[str, Any]:
    """The section's tables by name; problems are listed and the bad tables left out."""
    tables = document.get(section)
    key = at.child(section)
    if tables is None or tables == {}:
        at.problems.add(key.error(f"at least one {what} is required, as [{section}.<name>]"))
        return {}
    if not isinstance(tables, dict):
        at.problems.add(key.error(f"expected tables [{section}.<name>], got {_shown(tables)}"))
        return {}
    named: dict[str, Any] = {}
    for name, table in tables.items():
        if _NAME.fullmatch(name):
            named[name] = table
        else:
            at.problems.add(key.child(name).error(f"a {what} name is {_NAME_RULE}"))
    return named


def _job(name: str, raw: object, at: _At) -> JobConfig:
    values = _read_table(JobConfig, raw, at)
    if values["target_class"] is TargetClass.D:
        attempts = values.setdefault("max_attempts", MAX_ATTEMPTS_CLASS_D)
        if attempts != MAX_ATTEMPTS_CLASS_D:
            raise at.child("max_attempts").error(
                "class D (no fence, no idempotency key) allows one attempt only; set 1 or leave "
                f"it out, got {attempts}"
            )
    job = JobConfig(name=name, **values)
    if job.backoff_max_seconds < job.backoff_initial_seconds:
        raise at.child("backoff_max_seconds").error(
            f"must be at least backoff_initial_seconds "
            f"({_number_text(job.backoff_initial_seconds)}), "
            f"got {_number_text(job.backoff_max_seconds)}"
        )
    return job


def _subscription(name: str, raw: object, at: _At, declared: set[str] | None) -> SubscriptionConfig:
    """One subscription; ``declared`` names every job table (None: the section is unusable)."""
    if not isinstance(raw, dict):
        raise at.error(f"expected a table, got {_shown(raw)}")
    if "source" not in raw:
        raise at.child("source").error("required key is missing; expected 'sqs' or 'pubsub'")
    source = Source(_Choice(Source).read(raw["source"], at.child("source")))
    sub = SubscriptionConfig(name=name, **_read_table(SubscriptionConfig, raw, at, scope=source))
    problems: list[ConfigError] = []

    for position, job_type in enumerate(sub.job_types):
        if declared is not None and job_type not in declared:
            problems.append(
                at.child("job_types")
                .index(position)
                .error(f"no job type {job_type!r}; define it as [jobs.{job_type}]")
            )
    decode, where = sub.decode, at.child("decode")
    if (
        decode.operation_id.kind is SourceKind.MESSAGE_ID
        and not decode.operation_id_from_message_id
    ):
        problems.append(
            where.child("operation_id").error(
                "'message_id' needs operation_id_from_message_id = true: a producer's resend "
                "gets a new message id and would become a second operation"
            )
        )
    if (
        decode.operation_id_from_message_id
        and decode.operation_id.kind is not SourceKind.MESSAGE_ID
    ):
        problems.append(
            where.child("operation_id_from_message_id").error(
                f"is true, but operation_id is {str(decode.operation_id)!r}, not 'message_id'"
            )
        )
    if decode.job_type.kind is SourceKind.VALUE and decode.job_type.argument not in sub.job_types:
        problems.append(
            where.child("job_type").error(
                f"the constant {decode.job_type.argument!r} is not one of job_types"
            )
        )
    if sub.schema_versions and decode.schema_version is None:
        problems.append(
            where.child("schema_version").error(
                "required key is missing: schema_versions lists the accepted versions, so the "
                "version must be decoded"
            )
        )
    version = decode.schema_version
    if (
        version is not None
        and version.kind is SourceKind.VALUE
        and sub.schema_versions
        and version.argument not in sub.schema_versions
    ):
        problems.append(
            where.child("schema_version").error(
                f"the constant {version.argument!r} is not one of schema_versions"
            )
        )
    for problem in problems:
        at.problems.add(problem)
    if problems:
        raise _Reported(at.key)
    return sub


# -- the reference ----------------------------------------------------------------------------

_SECTIONS: Final[tuple[tuple[str, type[Any]], ...]] = (
    ("[bridge]", BridgeSettings),
    ("[jobs.<name>]", JobConfig),
    ("[subscriptions.<name>]", SubscriptionConfig),
    ("subscriptions.<name>.flow_control", FlowControl),
    ("[subscriptions.<name>.decode]", DecodeConfig),
    ("[retention]", RetentionConfig),
)

_INTRO: Final = f"""\
fencebridge reads one TOML file: process settings in `[bridge]`, one `[jobs.<name>]` table per
job type and one `[subscriptions.<name>]` table per broker subscription, each with its
`[subscriptions.<name>.decode]` rules, and the retention plan in `[retention]`.
`docs/examples/bridge.toml` is a complete example.

The file is checked whole before anything starts, and every problem in it is reported at
once, one per line. Every error names the file, the dotted key and what is wrong; unknown keys
are errors, so a typo cannot fall back to a default. Secrets
never come from the file: the database URL is read from `{DATABASE_URL_ENV}`, and a
`database_url` key anywhere in the file is an error. AWS and Google credentials, endpoints and
emulators come from the variables their client libraries read (`AWS_*`,
`PUBSUB_EMULATOR_HOST`, `GOOGLE_APPLICATION_CREDENTIALS`)."""

_SOURCE_MEANING: Final[Mapping[SourceKind, str]] = {
    SourceKind.ATTRIBUTE: "the broker message attribute `NAME` (SQS message attribute, Pub/Sub "
    "attribute), matched exactly",
    SourceKind.BODY: "the value at an RFC 6901 JSON pointer into the JSON body (`~1` is `/`, "
    "`~0` is `~`); `body:` with an empty pointer is the whole document",
    SourceKind.VALUE: "the constant `TEXT`, for a subscription that carries one tenant, job "
    "type or schema version",
    SourceKind.MESSAGE_ID: "the broker's message id (weaker: see `operation_id_from_message_id`)",
}


def _literal(value: object) -> str:
    """A default as TOML spells it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | FieldSource | PayloadSource):
        return json.dumps(str(value))
    if isinstance(value, tuple):
        return f"[{', '.join(_literal(v) for v in value)}]"
    return repr(value)


def _default_markdown(f: Field[Any], spec: _Spec) -> str:
    if spec.default_text is not None:
        return f"default {spec.default_text}"
    if not _has_default(f) or spec.required:
        return "required"
    if f.default is None:
        return "optional"
    default = f.default_factory() if callable(f.default_factory) else f.default
    return f"default `{_literal(default)}`"


def _key_markdown(f: Field[Any], spec: _Spec) -> str:
    facts = [spec.value.describe()]
    if spec.only is not None:
        facts.append(f"`{spec.only}` only")
    facts.append(_default_markdown(f, spec))
    return f"### `{f.name}`\n\n{'; '.join(facts)}.\n\n{spec.doc}"


def _sources_markdown() -> str:
    allowed: dict[SourceKind, list[str]] = {kind: [] for kind in SourceKind}
    for f, spec in _specs(DecodeConfig):
        if isinstance(spec.value, _Sources):
            for kind in spec.value.allowed:
                allowed[kind].append(f"`{f.name}`")
    rows = [
        f"| `{_SPELLING[kind]}` | {_SOURCE_MEANING[kind]} | {', '.join(allowed[kind])} |"
        for kind in SourceKind
    ]
    return "\n".join(
        [
            "## Field sources",
            "",
            "| source | reads | allowed for |",
            "| --- | --- | --- |",
            *rows,
        ]
    )


def _reasons_markdown() -> str:
    rows = [f"| `{reason}` | {text} |" for reason, text in REASONS.items()]
    return "\n".join(
        [
            "## Quarantine reasons",
            "",
            "A rejection's reason is `<code>: <explanation>`; the codes are stable.",
            "",
            "| code | meaning |",
            "| --- | --- |",
            *rows,
        ]
    )


def reference_markdown() -> str:
    """The configuration reference, generated from the dataclasses' own field metadata."""
    parts = [
        "# Configuration reference",
        "<!-- Generated by `python -m bridge.config` from bridge/config.py; edit it there. -->",
        _INTRO,
    ]
    for title, cls in _SECTIONS:
        parts.append(f"## `{title}`")
        parts.append(inspect.cleandoc(cls.__doc__ or ""))
        parts.extend(_key_markdown(f, spec) for f, spec in _specs(cls))
    parts.append(_sources_markdown())
    parts.append("## Decoding rules")
    parts.append(RULES_MARKDOWN.strip())
    parts.append(_reasons_markdown())
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference_markdown())
