"""From a raw broker delivery to an operation: decode with confidence, or quarantine with a reason.

:func:`decode` is pure and total. It reads nothing but its arguments, does no I/O, and no input
makes it raise: arbitrary bytes, arbitrary attribute maps (NULs, lone surrogates, huge values)
and arbitrary JSON all end as either a :class:`~bridge.types.Delivery` or a
:class:`~bridge.types.Rejection`. A consumer can therefore decode a whole received batch and
hand it to the inbox without a ``try``: a poison message is recorded and acknowledged, never
redelivered forever and never able to stop the consumer.

Nothing is guessed. An identifier that is absent, empty, not a JSON string, too long or not
storable as PostgreSQL text (which cannot hold NUL) quarantines the delivery. A rejection's
reason is ``"<code>: <explanation>"``; the code is a stable :class:`Reason` (fit for a metric
label) and the explanation names where the value came from (an attribute name, a JSON pointer)
but never the value itself, nor any payload byte: reasons are stored and may be logged.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from bridge.types import Delivery, RawDelivery, Rejection, TargetClass

#: longest tenant id, operation id, job type or schema version accepted, in characters
IDENTIFIER_MAX_CHARS: Final = 256
#: longest ordering key (SQS MessageGroupId: 128, Pub/Sub ordering key: 1024 bytes)
ORDERING_KEY_MAX_CHARS: Final = 1024
#: longest broker message id kept; a longer one is dropped from the record
MESSAGE_ID_MAX_CHARS: Final = 1024
#: longest trace context kept (a W3C traceparent is 55 characters)
TRACE_CONTEXT_MAX_CHARS: Final = 512
#: the receive count is stored in a PostgreSQL ``integer``
RECEIVE_COUNT_MAX: Final = 2**31 - 1
#: the range of a priority (stored in a PostgreSQL ``smallint``, multiplied by the aging)
PRIORITY_MIN: Final = -1000
PRIORITY_MAX: Final = 1000
_INTEGER_TEXT = re.compile("-?(0|[1-9][0-9]{0,3})")

# C0 and C1 control characters (NUL included) and lone surrogates: not storable or not sane.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_PRINTABLE_ASCII = re.compile("[\x20-\x7e]+")
_ARRAY_INDEX = re.compile("0|[1-9][0-9]*")


class Reason(enum.StrEnum):
    """The stable code at the head of every rejection reason.

    Declared in the order problems are reported: when a delivery has several, the first one
    listed here becomes its reason.
    """

    SUBSCRIPTION_MISMATCH = "subscription_mismatch"
    BODY_TOO_LARGE = "body_too_large"
    BODY_NOT_UTF8 = "body_not_utf8"
    BODY_NOT_JSON = "body_not_json"
    MISSING_TENANT_ID = "missing_tenant_id"
    EMPTY_TENANT_ID = "empty_tenant_id"
    INVALID_TENANT_ID = "invalid_tenant_id"
    MISSING_OPERATION_ID = "missing_operation_id"
    EMPTY_OPERATION_ID = "empty_operation_id"
    INVALID_OPERATION_ID = "invalid_operation_id"
    MISSING_JOB_TYPE = "missing_job_type"
    EMPTY_JOB_TYPE = "empty_job_type"
    INVALID_JOB_TYPE = "invalid_job_type"
    UNKNOWN_JOB_TYPE = "unknown_job_type"
    MISSING_SCHEMA_VERSION = "missing_schema_version"
    EMPTY_SCHEMA_VERSION = "empty_schema_version"
    INVALID_SCHEMA_VERSION = "invalid_schema_version"
    UNKNOWN_SCHEMA_VERSION = "unknown_schema_version"
    MISSING_PAYLOAD = "missing_payload"
    INVALID_PAYLOAD = "invalid_payload"
    INVALID_ORDERING_KEY = "invalid_ordering_key"
    INVALID_PRIORITY = "invalid_priority"
    DECODE_FAILED = "decode_failed"


#: what each reason code means, for the configuration reference
REASONS: Final[Mapping[Reason, str]] = {
    Reason.SUBSCRIPTION_MISMATCH: "the delivery was handed to another subscription's rules",
    Reason.BODY_TOO_LARGE: "the body is longer than `max_body_bytes`; checked before parsing",
    Reason.BODY_NOT_UTF8: "a `body:` source is used and the body is not valid UTF-8",
    Reason.BODY_NOT_JSON: (
        "a `body:` source is used and the body is not one strict JSON document (also: "
        "duplicate object keys, `NaN`/`Infinity`, numbers beyond a double, nesting too deep)"
    ),
    Reason.MISSING_TENANT_ID: "the attribute is absent, the pointer finds nothing, or is `null`",
    Reason.EMPTY_TENANT_ID: "the value is empty or only whitespace",
    Reason.INVALID_TENANT_ID: (
        "not a string, too long, a control character (NUL included), a lone surrogate, or "
        "surrounding whitespace"
    ),
    Reason.MISSING_OPERATION_ID: (
        "as `missing_tenant_id`; with `message_id`, the broker gave no message id"
    ),
    Reason.EMPTY_OPERATION_ID: "as `empty_tenant_id`",
    Reason.INVALID_OPERATION_ID: "as `invalid_tenant_id`",
    Reason.MISSING_JOB_TYPE: "as `missing_tenant_id`",
    Reason.EMPTY_JOB_TYPE: "as `empty_tenant_id`",
    Reason.INVALID_JOB_TYPE: "as `invalid_tenant_id`",
    Reason.UNKNOWN_JOB_TYPE: "the job type is not one of the subscription's `job_types`",
    Reason.MISSING_SCHEMA_VERSION: "as `missing_tenant_id` (only when a source is configured)",
    Reason.EMPTY_SCHEMA_VERSION: "as `empty_tenant_id`",
    Reason.INVALID_SCHEMA_VERSION: "as `invalid_tenant_id`",
    Reason.UNKNOWN_SCHEMA_VERSION: "the version is not one of the subscription's `schema_versions`",
    Reason.MISSING_PAYLOAD: "the payload pointer finds nothing, or `null`",
    Reason.INVALID_PAYLOAD: (
        "the pointed value holds a lone surrogate escape or is nested too deeply to be "
        "written as canonical JSON"
    ),
    Reason.INVALID_ORDERING_KEY: (
        "the ordering key (SQS message group, Pub/Sub ordering key) holds a control character "
        "or a lone surrogate, or is too long; dropping it would silently break ordering"
    ),
    Reason.INVALID_PRIORITY: (
        f"the `decode.priority` source holds something other than a whole number from "
        f"{PRIORITY_MIN} to {PRIORITY_MAX} (a JSON integer, or its decimal text); absent or "
        "`null`, the job type's priority applies"
    ),
    Reason.DECODE_FAILED: (
        "an unexpected internal error; the delivery is kept so it can be decoded again"
    ),
}

#: the decoding rules, for the configuration reference (kept beside the code that applies them)
RULES_MARKDOWN: Final = f"""\
Identifiers (`tenant_id`, `operation_id`, `job_type`, `schema_version`) are strict:

- They must be text: a `body:` pointer must find a JSON **string**. JSON numbers and booleans
  are rejected (`invalid_*`), not converted: `1`, `1.0` and `1e0` are one number but three
  texts, and an operation's identity must not depend on how a producer's serializer prints a
  number. Ask the producer to send a string. A JSON `null` counts as absent (`missing_*`).
- At most {IDENTIFIER_MAX_CHARS} characters; no control character (C0, DEL, C1; NUL above
  all, which PostgreSQL text cannot hold); no lone surrogate (not valid Unicode text); no
  leading or trailing whitespace (`"a1"` and `"a1 "` would be two operations). Empty or
  whitespace-only values are `empty_*`. Nothing is trimmed, folded or normalised: what is
  stored is exactly what was sent.
- A body is parsed only when a `body:` source is configured, after the size check. Parsing is
  strict JSON: UTF-8 without a byte-order mark, no duplicate object keys (parsers disagree on
  which one wins), no `NaN` or `Infinity`, no number beyond a double's range.

The payload (`decode.payload`) is what is hashed (sha256) and stored. `body` takes the raw body
byte for byte. `body:/pointer` takes the canonical JSON of the pointed value: keys sorted, no
whitespace, non-ASCII characters as UTF-8 (`json.dumps(value, sort_keys=True,
separators=(",", ":"), ensure_ascii=False)`), so key order and formatting do not change the
hash. Numbers are compared as parsed: integers exactly, fractions as doubles (so `1` and `1.0`
differ, while `0.1` and `0.10` are equal).

Fields passed through from the broker are sanitised, never guessed:

- `broker_message_id` and `trace_context` are informational: a value that is not clean text
  is dropped and the delivery is still decoded. A message id must have no control character
  or lone surrogate and at most {MESSAGE_ID_MAX_CHARS} characters; a trace context must be
  printable ASCII of at most {TRACE_CONTEXT_MAX_CHARS} characters.
- `receive_count` is dropped unless it is an integer from 0 to {RECEIVE_COUNT_MAX}.
- `ordering_key` decides claim order within a group, so a bad one quarantines the delivery
  (`invalid_ordering_key`) rather than being dropped; an empty ordering key means none
  (Pub/Sub reports unordered messages with an empty key).

A rejection keeps the raw body (so it can be decoded again once the rules change), the broker
message id, and the tenant id, operation id and job type when they were found and valid. Its
reason is `<code>: <explanation>`; the explanation names the attribute or pointer, never the
value.
"""


class SourceKind(enum.StrEnum):
    """Where a decoded field comes from."""

    ATTRIBUTE = "attribute"  #: a broker message attribute, by name
    BODY = "body"  #: an RFC 6901 JSON pointer into the JSON body
    VALUE = "value"  #: a constant written in the configuration
    MESSAGE_ID = "message_id"  #: the broker's message id (operation ids only, by opt-in)


_IDENTIFIER_RULES: Final[tuple[tuple[Callable[[str], object], str], ...]] = (
    (lambda t: len(t) > IDENTIFIER_MAX_CHARS, f"is longer than {IDENTIFIER_MAX_CHARS} characters"),
    (_SURROGATE.search, "is not valid Unicode text (lone surrogate)"),
    (lambda t: "\x00" in t, "contains a NUL character"),
    (_CONTROL.search, "contains a control character"),
    (lambda t: not t.strip(), "is empty"),
    (lambda t: t != t.strip(), "has leading or trailing whitespace"),
)


def identifier_problem(text: str) -> str | None:
    """Why ``text`` cannot be an identifier, as a short phrase without the text; None if fine."""
    return next((problem for test, problem in _IDENTIFIER_RULES if test(text)), None)


def _pointer_tokens(pointer: str) -> tuple[str, ...]:
    """RFC 6901: "" is the whole document; otherwise "/"-separated, "~1" is "/", "~0" is "~"."""
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise ValueError("a JSON pointer is empty or starts with '/'")
    tokens = pointer[1:].split("/")
    for token in tokens:
        if re.search("~(?![01])", token):
            raise ValueError("in a JSON pointer '~' must be followed by '0' or '1'")
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in tokens)


def _config_text_problem(text: str) -> str | None:
    """Attribute names and pointers end up in reasons, so they must be clean text too."""
    if _SURROGATE.search(text) or _CONTROL.search(text):
        return "contains a control character or a lone surrogate"
    if len(text) > IDENTIFIER_MAX_CHARS:
        return f"is longer than {IDENTIFIER_MAX_CHARS} characters"
    return None


@dataclass(frozen=True, slots=True)
class FieldSource:
    """``attribute:NAME``, ``body:/json/pointer``, ``value:TEXT`` or ``message_id``."""

    kind: SourceKind
    #: the attribute name, the JSON pointer or the constant; empty for ``message_id``
    argument: str = ""
    tokens: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        tokens: tuple[str, ...] = ()
        if self.kind is SourceKind.ATTRIBUTE:
            if not self.argument:
                raise ValueError("the attribute name is empty")
            problem = _config_text_problem(self.argument)
            if problem:
                raise ValueError(f"the attribute name {problem}")
        elif self.kind is SourceKind.BODY:
            problem = _config_text_problem(self.argument)
            if problem:
                raise ValueError(f"the JSON pointer {problem}")
            tokens = _pointer_tokens(self.argument)
        elif self.kind is SourceKind.VALUE:
            problem = identifier_problem(self.argument)
            if problem:
                raise ValueError(f"the constant {problem}")
        elif self.argument:
            raise ValueError("'message_id' takes no argument")
        object.__setattr__(self, "tokens", tokens)

    @classmethod
    def parse(cls, text: str) -> FieldSource:
        """Read the configuration's spelling; raises ValueError naming what is wrong."""
        if text == SourceKind.MESSAGE_ID:
            return cls(SourceKind.MESSAGE_ID)
        prefix, colon, argument = text.partition(":")
        if not colon or prefix not in (SourceKind.ATTRIBUTE, SourceKind.BODY, SourceKind.VALUE):
            raise ValueError(f"unknown field source {text!r}")
        return cls(SourceKind(prefix), argument)

    def __str__(self) -> str:
        if self.kind is SourceKind.MESSAGE_ID:
            return str(self.kind)
        return f"{self.kind}:{self.argument}"

    def describe(self) -> str:
        """Where the value comes from, for a reason (configuration text only, never data)."""
        if self.kind is SourceKind.ATTRIBUTE:
            return f"attribute {self.argument!r}"
        if self.kind is SourceKind.BODY:
            return f"body pointer {self.argument!r}"
        if self.kind is SourceKind.VALUE:
            return "the configured constant"
        return "the broker message id"


@dataclass(frozen=True, slots=True)
class PayloadSource:
    """``body`` (the raw body, byte for byte) or ``body:/pointer`` (canonical JSON of a value)."""

    #: None: the raw body; otherwise a JSON pointer ("" is the whole document)
    pointer: str | None = None
    tokens: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        tokens: tuple[str, ...] = ()
        if self.pointer is not None:
            problem = _config_text_problem(self.pointer)
            if problem:
                raise ValueError(f"the JSON pointer {problem}")
            tokens = _pointer_tokens(self.pointer)
        object.__setattr__(self, "tokens", tokens)

    @classmethod
    def parse(cls, text: str) -> PayloadSource:
        """Read the configuration's spelling; raises ValueError naming what is wrong."""
        if text == "body":
            return cls()
        prefix, colon, pointer = text.partition(":")
        if prefix != "body" or not colon:
            raise ValueError(f"unknown payload source {text!r}")
        return cls(pointer)

    def __str__(self) -> str:
        return "body" if self.pointer is None else f"body:{self.pointer}"


@dataclass(frozen=True, slots=True)
class JobRule:
    """What the decoder copies from the job table onto a delivery of that job type."""

    target_class: TargetClass
    max_attempts: int
    #: the priority of its deliveries, unless ``decode.priority`` gives one
    priority: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeRules:
    """One subscription's decoding rules, joined with the job types it accepts."""

    subscription: str
    tenant_id: FieldSource
    operation_id: FieldSource
    job_type: FieldSource
    #: the job types this subscription accepts, by name
    jobs: Mapping[str, JobRule]
    max_body_bytes: int
    schema_version: FieldSource | None = None
    #: accepted schema versions; empty means no check
    schema_versions: frozenset[str] = frozenset()
    payload: PayloadSource = field(default_factory=PayloadSource)
    #: where a delivery's own priority is read (None: its job type's)
    priority: FieldSource | None = None

    def __post_init__(self) -> None:
        # The configuration reports these with file and key; this guards direct construction.
        if self.operation_id.kind is SourceKind.VALUE:
            raise ValueError("a constant operation id would make every delivery one operation")
        for name in ("tenant_id", "job_type", "schema_version", "priority"):
            source = getattr(self, name)
            if source is not None and source.kind is SourceKind.MESSAGE_ID:
                raise ValueError(f"'message_id' is a source for operation_id only, not {name}")
        if not self.jobs:
            raise ValueError("a subscription accepts at least one job type")
        if self.schema_versions and self.schema_version is None:
            raise ValueError("schema_versions needs a schema_version source")
        if self.max_body_bytes < 0:
            raise ValueError("max_body_bytes cannot be negative")

    @property
    def reads_body(self) -> bool:
        """Whether the body must be parsed as JSON to decode a delivery."""
        sources = (
            self.tenant_id,
            self.operation_id,
            self.job_type,
            self.schema_version,
            self.priority,
        )
        return self.payload.pointer is not None or any(
            s is not None and s.kind is SourceKind.BODY for s in sources
        )


# -- decoding ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Problem:
    reason: Reason
    detail: str

    def text(self) -> str:
        return f"{self.reason}: {self.detail}"


class _Unavailable:
    """The body could not be read; its own problem is reported first."""


_UNAVAILABLE: Final = _Unavailable()
_ABSENT: Final = object()


class _StrictJsonError(ValueError):
    """Valid to Python's parser, but not a document the bridge can read with confidence."""


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    document = dict(pairs)
    if len(document) != len(pairs):
        raise _StrictJsonError("an object has a duplicate key")
    return document


def _no_constant(_name: str) -> object:
    raise _StrictJsonError("NaN and Infinity are not JSON")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise _StrictJsonError("a number is beyond the range of a double")
    return number


def _parse_body(body: bytes) -> object:
    """The JSON document, or the problem that stops it being read (returned, not raised)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _Problem(Reason.BODY_NOT_UTF8, f"invalid UTF-8 at byte {exc.start}")
    try:
        return json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_constant=_no_constant,
            parse_float=_finite_float,
        )
    except _StrictJsonError as exc:
        return _Problem(Reason.BODY_NOT_JSON, str(exc))
    except json.JSONDecodeError as exc:
        # exc.msg can quote a character of the body; only the position is reported.
        return _Problem(Reason.BODY_NOT_JSON, f"invalid JSON at character {exc.pos}")
    except RecursionError:
        return _Problem(Reason.BODY_NOT_JSON, "nested too deeply")
    except ValueError:
        # Python refuses integers of more than a few thousand digits.
        return _Problem(Reason.BODY_NOT_JSON, "an integer is too long")


def _resolve(document: object, tokens: tuple[str, ...]) -> object:
    """The value at an RFC 6901 pointer, or _ABSENT."""
    node = document
    for token in tokens:
        if isinstance(node, dict):
            if token not in node:
                return _ABSENT
            node = node[token]
        elif isinstance(node, list):
            if not _ARRAY_INDEX.fullmatch(token) or int(token) >= len(node):
                return _ABSENT
            node = node[int(token)]
        else:
            return _ABSENT
    return node


_JSON_TYPES: Final = {bool: "a JSON boolean", int: "a JSON number", float: "a JSON number"}


def _lookup(source: FieldSource, raw: RawDelivery, document: object) -> object:
    """The raw value a source points at: any object, _ABSENT, or _UNAVAILABLE."""
    if source.kind is SourceKind.ATTRIBUTE:
        return raw.attributes.get(source.argument, _ABSENT)
    if source.kind is SourceKind.BODY:
        if isinstance(document, _Unavailable):
            return document
        return _resolve(document, source.tokens)
    if source.kind is SourceKind.VALUE:
        return source.argument
    return _ABSENT if raw.message_id is None else raw.message_id


def _identifier(
    name: str, source: FieldSource, raw: RawDelivery, document: object
) -> str | _Problem | _Unavailable:
    value = _lookup(source, raw, document)
    if isinstance(value, _Unavailable):
        return value
    where = source.describe()
    problem: tuple[str, str] | None = None
    if value is _ABSENT:
        problem = (
            "missing",
            f"{where} {'finds nothing' if source.kind is SourceKind.BODY else 'is absent'}",
        )
    elif value is None:
        problem = ("missing", f"{where} is null")
    elif not isinstance(value, str):
        kind = _JSON_TYPES.get(type(value), "a JSON object or array")
        problem = ("invalid", f"{where} is {kind}, not a string")
    elif value == "":
        problem = ("empty", f"{where} is empty")
    else:
        found = identifier_problem(value)
        if found == "is empty":
            problem = ("empty", f"{where} is only whitespace")
        elif found:
            problem = ("invalid", f"{where} {found}")
    if problem is None and isinstance(value, str):
        return value
    kind, detail = problem or ("invalid", f"{where} is not text")
    return _Problem(Reason(f"{kind}_{name}"), detail)


def _canonical(value: object, where: str) -> bytes | _Problem:
    try:
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _Problem(Reason.INVALID_PAYLOAD, f"{where} holds a lone surrogate escape")
    except RecursionError:
        return _Problem(Reason.INVALID_PAYLOAD, f"{where} is nested too deeply")


def _payload(rules: DecodeRules, body: bytes, document: object) -> bytes | _Problem | _Unavailable:
    source = rules.payload
    if source.pointer is None:
        return body
    if isinstance(document, _Unavailable):
        return document
    where = f"payload pointer {source.pointer!r}"
    value = _resolve(document, source.tokens)
    if value is _ABSENT:
        return _Problem(Reason.MISSING_PAYLOAD, f"{where} finds nothing")
    if value is None:
        return _Problem(Reason.MISSING_PAYLOAD, f"{where} is null")
    return _canonical(value, where)


def _clean_text(value: object, max_chars: int) -> str | None:
    """An optional broker field kept only if it is storable, non-empty text."""
    if not isinstance(value, str) or not value or len(value) > max_chars:
        return None
    if _CONTROL.search(value) or _SURROGATE.search(value):
        return None
    return value


def _clean_trace_context(value: object) -> str | None:
    if not isinstance(value, str) or len(value) > TRACE_CONTEXT_MAX_CHARS:
        return None
    return value if _PRINTABLE_ASCII.fullmatch(value) else None


def _clean_receive_count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= RECEIVE_COUNT_MAX else None


def _ordering_key(value: object) -> str | _Problem | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        return _Problem(Reason.INVALID_ORDERING_KEY, "the ordering key is not text")
    if len(value) > ORDERING_KEY_MAX_CHARS:
        return _Problem(
            Reason.INVALID_ORDERING_KEY,
            f"the ordering key is longer than {ORDERING_KEY_MAX_CHARS} characters",
        )
    if _CONTROL.search(value) or _SURROGATE.search(value):
        return _Problem(
            Reason.INVALID_ORDERING_KEY,
            "the ordering key contains a control character or a lone surrogate",
        )
    return value


def _priority(source: FieldSource, raw: RawDelivery, document: object) -> int | _Problem | None:
    """A delivery's own priority: None when the source finds nothing (the job type's applies)."""
    value = _lookup(source, raw, document)
    if value is _ABSENT or value is None or isinstance(value, _Unavailable):
        return None  # an unreadable body is reported on its own
    where = source.describe()
    if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value):
        value = int(value)
    if type(value) is not int or not PRIORITY_MIN <= value <= PRIORITY_MAX:
        return _Problem(
            Reason.INVALID_PRIORITY,
            f"{where} is not a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}",
        )
    return value


def _found(value: object) -> str | None:
    return value if isinstance(value, str) else None


# Problems are reported in the order the reasons are declared; the first becomes the reason.
_ORDER: Final = {reason: rank for rank, reason in enumerate(Reason)}


def _rank(problem: _Problem) -> int:
    return _ORDER[problem.reason]


# Cannot happen (every unusable field carries a problem); kept so the types stay total.
_NOTHING_DECODED: Final = _Problem(Reason.DECODE_FAILED, "no field could be decoded")


def _decode(rules: DecodeRules, raw: RawDelivery) -> Delivery | Rejection:
    body = raw.body if type(raw.body) is bytes else bytes(raw.body)
    message_id = _clean_text(raw.message_id, MESSAGE_ID_MAX_CHARS)

    def reject(problem: _Problem, **found: str | None) -> Rejection:
        return Rejection(
            subscription=rules.subscription,
            reason=problem.text(),
            body=body,
            broker_message_id=message_id,
            **found,
        )

    if raw.subscription != rules.subscription:
        return reject(
            _Problem(Reason.SUBSCRIPTION_MISMATCH, "the delivery is for another subscription")
        )

    # The size is checked before anything is parsed: the limit protects the parser too.
    problems: list[_Problem] = []
    document: object = _UNAVAILABLE
    if len(body) > rules.max_body_bytes:
        problems.append(
            _Problem(
                Reason.BODY_TOO_LARGE,
                f"{len(body)} bytes exceeds max_body_bytes ({rules.max_body_bytes})",
            )
        )
    elif rules.reads_body:
        document = _parse_body(body)
        if isinstance(document, _Problem):
            problems.append(document)
            document = _UNAVAILABLE

    tenant_id = _identifier("tenant_id", rules.tenant_id, raw, document)
    operation_id = _identifier("operation_id", rules.operation_id, raw, document)
    job_type = _identifier("job_type", rules.job_type, raw, document)
    if isinstance(job_type, str) and job_type not in rules.jobs:
        problems.append(
            _Problem(Reason.UNKNOWN_JOB_TYPE, "not one of the subscription's job_types")
        )
    schema_version = (
        None
        if rules.schema_version is None
        else _identifier("schema_version", rules.schema_version, raw, document)
    )
    if (
        isinstance(schema_version, str)
        and rules.schema_versions
        and schema_version not in rules.schema_versions
    ):
        problems.append(
            _Problem(Reason.UNKNOWN_SCHEMA_VERSION, "not one of the subscription's schema_versions")
        )
    payload = _payload(rules, body, document)
    ordering_key = _ordering_key(raw.ordering_key)
    priority = None if rules.priority is None else _priority(rules.priority, raw, document)
    problems.extend(
        value
        for value in (
            tenant_id,
            operation_id,
            job_type,
            schema_version,
            payload,
            ordering_key,
            priority,
        )
        if isinstance(value, _Problem)
    )

    if (
        problems
        or not isinstance(tenant_id, str)
        or not isinstance(operation_id, str)
        or not isinstance(job_type, str)
        or not isinstance(payload, bytes)
        or isinstance(schema_version, (_Problem, _Unavailable))
        or isinstance(ordering_key, _Problem)
        or isinstance(priority, _Problem)
    ):
        return reject(
            min(problems, key=_rank) if problems else _NOTHING_DECODED,
            tenant_id=_found(tenant_id),
            operation_id=_found(operation_id),
            job_type=_found(job_type),
        )

    job = rules.jobs[job_type]
    return Delivery(
        tenant_id=tenant_id,
        operation_id=operation_id,
        subscription=rules.subscription,
        job_type=job_type,
        target_class=job.target_class,
        payload=payload,
        schema_version=schema_version,
        max_attempts=job.max_attempts,
        ordering_key=ordering_key,
        broker_message_id=message_id,
        receive_count=_clean_receive_count(raw.receive_count),
        trace_context=_clean_trace_context(raw.trace_context),
        priority=job.priority if priority is None else priority,
    )


def decode(rules: DecodeRules, raw: RawDelivery) -> Delivery | Rejection:
    """Decode one delivery with the subscription's rules; never raises.

    The first problem found, in this order, becomes the rejection's reason: subscription, body
    size, body parsing, tenant id, operation id, job type, schema version, payload, ordering
    key. Identifiers that were found and valid are kept on the rejection all the same.
    """
    try:
        return _decode(rules, raw)
    except Exception as exc:  # noqa: BLE001  (a bug must quarantine, not crash the consumer)
        return undecodable(rules.subscription, raw, exc)


def undecodable(subscription: str, raw: RawDelivery, exc: Exception) -> Rejection:
    """The record of a delivery whose decoding raised.

    A bug must not turn one message into a poison pill that stops its consumer: the delivery
    is quarantined whole and can be decoded again once the bug is fixed. Only the error's type
    is kept; its text may quote the input.
    """
    return Rejection(
        subscription=subscription,
        reason=f"{Reason.DECODE_FAILED}: unexpected {type(exc).__name__}",
        body=raw.body if isinstance(raw.body, bytes) else None,
        broker_message_id=_clean_text(raw.message_id, MESSAGE_ID_MAX_CHARS),
    )
