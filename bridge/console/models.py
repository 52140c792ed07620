"""The console API's request and response models: one definition that FastAPI validates
requests against, filters answers through and writes the OpenAPI document from.

Text fields refuse what PostgreSQL or a terminal cannot take safely: NUL, lone surrogates and,
in a reason (it is stored in the audit and printed by ``fencebridge inspect``), any control or
format character.
"""

from __future__ import annotations

import unicodedata
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt
from pydantic_core import PydanticCustomError

TEXT_MAX = 1000
StateName = Literal["queued", "claimed", "succeeded", "failed_terminal", "unknown", "quarantined"]
Redrivable = Literal["unknown", "quarantined"]
Window = Literal["15m", "1h", "6h", "24h"]
RejectedKind = Literal["conflict", "quarantined"]
Flag = Literal["true", "false"]
TIME = "date-time"


def clean_text(value: str) -> str:
    """``value`` if it is non-blank, short, and without NUL or a lone surrogate."""
    if not value.strip():
        raise PydanticCustomError("blank", "must be a non-empty string")
    if len(value) > TEXT_MAX:
        raise PydanticCustomError("too_long", f"must be at most {TEXT_MAX} characters")
    if "\x00" in value or any(unicodedata.category(c) == "Cs" for c in value):
        raise PydanticCustomError("unsafe", "must not hold NUL or a lone surrogate")
    return value


def clean_reason(value: str) -> str:
    """A reason: clean text without control or format characters (no CR, LF, escape)."""
    clean_text(value)
    if any(unicodedata.category(c) in ("Cc", "Cf") for c in value):
        raise PydanticCustomError("control", "must not hold control characters")
    return value


def clean_filter(value: str) -> str:
    """A filter of a query string: like a reason, printable text only."""
    return clean_reason(value)


Text = Annotated[str, AfterValidator(clean_text)]
Reason = Annotated[str, AfterValidator(clean_reason), Field(description="recorded in the audit")]
Filter = Annotated[str, AfterValidator(clean_filter)]
Hash = Annotated[str | None, Field(description="keyed hash (never the raw identifier)")]
Time = Annotated[str | None, Field(json_schema_extra={"format": TIME})]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Problem(BaseModel):
    type: str = "about:blank"
    title: str
    status: int
    detail: str = Field(description="the specific reason")


# -- requests ------------------------------------------------------------------------------------


class OperationQuery(Strict):
    """The raw identifiers go in the body (never a URL); the answer shows their hashes."""

    tenant_id: Text
    operation_id: Text


class PayloadQuery(Strict):
    tenant_id: Text
    operation_id: Text
    reason: Reason


class RedriveRequest(Strict):
    reason: Reason
    dry_run: StrictBool = Field(description="true: show what would happen")
    states: list[Redrivable] = Field(default=["unknown", "quarantined"], min_length=1)
    subscription: Text | None = None
    job_type: Text | None = None
    tenant_id: Text | None = None
    operation_id: Text | None = Field(default=None, description="with tenant_id")
    limit: StrictInt = Field(default=100, ge=1, le=1000)
    extra_attempts: StrictInt = Field(default=1, ge=1, le=10)
    confirm_not_called: StrictBool = Field(default=False, description="class D, one operation")


# -- answers -------------------------------------------------------------------------------------


class StateCounts(BaseModel):
    queued: int
    claimed: int
    succeeded: int
    failed_terminal: int
    unknown: int
    quarantined: int


class CountGroup(BaseModel):
    subscription: str
    job_type: str
    tenant: Hash
    states: StateCounts


class Counts(BaseModel):
    counts: list[CountGroup]
    totals: StateCounts


class StatusGroup(BaseModel):
    subscription: str
    tenant: Hash
    states: StateCounts


class Status(BaseModel):
    """``fencebridge status --json``'s counts and figures."""

    counts: list[StatusGroup]
    totals: StateCounts
    stalled_claims: int = Field(description="held claims whose lease has expired")
    oldest_unknown_seconds: float | None
    rejected: dict[str, int] = Field(description="rejected deliveries awaiting a person, by kind")


class RowItem(BaseModel):
    tenant: Hash
    operation: Hash
    handle: str | None = Field(default=None, description="opens the operation (signed)")
    subscription: str
    job_type: str
    target_class: Literal["A", "B", "C", "D"]
    state: StateName
    fence: int
    attempts: int
    max_attempts: int
    outcome_code: str | None
    created_at: Time
    claimed_at: Time
    settled_at: Time
    lease_expires_at: Time


class RowPage(BaseModel):
    rows: list[RowItem]
    next_cursor: str | None = Field(description="null on the last page")


class RejectedPage(BaseModel):
    rejected: list[dict[str, Any]]
    next_cursor: str | None


class Operation(BaseModel):
    tenant: Hash
    operation: Hash
    work_row: dict[str, Any] | None = Field(description="null: no such row")
    absence: str | None = Field(description="without a work row: why, as far as is known")
    attempts: list[dict[str, Any]] = Field(description="the newest attempts, oldest first")
    redrives: list[dict[str, Any]]
    payload_views: list[dict[str, Any]] = Field(description="audited views of its payload")
    rejected_deliveries: list[dict[str, Any]]


class RedriveReport(BaseModel):
    dry_run: bool
    moved: int
    left: int
    rows: list[dict[str, Any]]
    deliveries: list[dict[str, Any]]


class Finding(BaseModel):
    job_type: str
    control: int = Field(ge=1, le=10)
    title: str
    go: bool
    evidence: str


class Checks(BaseModel):
    go: bool = Field(description="true only if every control holds")
    summary: str
    job_types: list[str]
    findings: list[Finding]


class FigurePoint(BaseModel):
    at: str = Field(json_schema_extra={"format": TIME})
    stalled: int = Field(description="held claims with an expired lease")
    oldest_unknown_seconds: float | None
    quarantined: int = Field(description="in this bucket")
    takeovers: int = Field(description="in this bucket")


class Figures(BaseModel):
    window: Window
    bucket_seconds: int
    current: FigurePoint | None
    series: list[FigurePoint] = Field(description="oldest first; each point ends its bucket")


class Payload(BaseModel):
    tenant: Hash
    operation: Hash
    bytes: int | None = Field(description="null: the payload is gone")
    payload_base64: str | None
    payload_text: str | None = Field(description="null: not UTF-8")
    viewed_at: Time
    viewed_by: str
    reason: str


# -- on call -------------------------------------------------------------------------------------


class AwaitingItem(BaseModel):
    what: Literal["row", "delivery"]
    kind: str = Field(description="the rows' state, or the deliveries' kind")
    count: int
    oldest_at: Time
    oldest_seconds: float | None = Field(description="the oldest one's age")


class Awaiting(BaseModel):
    """Parked and failed rows, open conflicts and quarantined deliveries: what awaits a person."""

    awaiting: list[AwaitingItem]


class GroupItem(BaseModel):
    handle: str = Field(description="opens the group (signed)")
    job_type: str
    state: StateName
    outcome_code: str | None
    error_class: str | None
    count: int
    first_seen: Time
    last_seen: Time
    redrivable: bool


class Groups(BaseModel):
    groups: list[GroupItem]


class GroupRow(BaseModel):
    tenant: Hash
    operation: Hash
    fence: int


class GroupRows(BaseModel):
    job_type: str
    state: StateName
    outcome_code: str | None
    error_class: str | None
    rows: list[GroupRow]


class GroupRedriveRequest(Strict):
    reason: Reason
    dry_run: StrictBool
    limit: StrictInt = Field(default=100, ge=1, le=100, description="the group's oldest rows")


class GroupRedriveReport(BaseModel):
    job_type: str
    state: StateName
    outcome_code: str | None
    error_class: str | None
    selected: int
    dry_run: bool
    moved: int
    left: int
    rate_per_minute: int


class ResolveRequest(Strict):
    delivery: Text = Field(description="the rejected delivery's handle")
    reason: Reason
    dry_run: StrictBool


class ResolveReport(BaseModel):
    dry_run: bool
    resolved: int
    not_open: list[str]
