"""The handler API without services: classification, backoff, the context's progress contract."""

from __future__ import annotations

import http.client
import json
import random
import threading
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.errors import LeaseLost
from bridge.executors.settlement import as_success, backoff
from bridge.handlers import (
    DEFAULT_CLASSIFICATION,
    Ambiguous,
    Context,
    HandlerOutcome,
    LeaseFlag,
    OutcomeKind,
    Quarantine,
    RetryLater,
    RetryPolicy,
    Success,
    TerminalFailure,
    classify,
)

# -- classify ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        # the request never left: nothing can have been applied
        (ConnectionRefusedError(), OutcomeKind.RETRY),
        # it may have been received and acted on
        (TimeoutError(), OutcomeKind.AMBIGUOUS),
        (ConnectionResetError(), OutcomeKind.AMBIGUOUS),
        (BrokenPipeError(), OutcomeKind.AMBIGUOUS),
        (http.client.RemoteDisconnected("closed"), OutcomeKind.AMBIGUOUS),
        (http.client.IncompleteRead(b""), OutcomeKind.AMBIGUOUS),
        # unreadable input: a person looks at it
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), OutcomeKind.QUARANTINE),
        (json.JSONDecodeError("Expecting value", "", 0), OutcomeKind.QUARANTINE),
        # validation and programming errors: retrying changes nothing
        (ValueError(), OutcomeKind.TERMINAL),
        (TypeError(), OutcomeKind.TERMINAL),
        (KeyError("amount"), OutcomeKind.TERMINAL),
        (IndexError(), OutcomeKind.TERMINAL),
        (PermissionError(), OutcomeKind.TERMINAL),
        # nobody anticipated it: nobody can say whether the effect happened
        (RuntimeError(), OutcomeKind.AMBIGUOUS),
        (ZeroDivisionError(), OutcomeKind.AMBIGUOUS),
        (OSError(), OutcomeKind.AMBIGUOUS),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_classify_follows_the_default_table(exc: BaseException, kind: OutcomeKind) -> None:
    outcome = classify(exc)
    assert outcome.kind is kind
    assert outcome.code == type(exc).__name__


def test_first_match_wins_so_more_specific_rows_come_first() -> None:
    # ConnectionRefusedError is a ConnectionError (ambiguous) but listed before it as a retry;
    # UnicodeDecodeError and JSONDecodeError are ValueErrors (terminal) but listed before it.
    position = {t: i for i, (t, _) in enumerate(DEFAULT_CLASSIFICATION)}
    assert position[ConnectionRefusedError] < position[ConnectionError]
    assert position[UnicodeDecodeError] < position[ValueError]
    assert position[json.JSONDecodeError] < position[ValueError]


def test_an_unclassified_exception_is_ambiguous_and_says_so() -> None:
    outcome = classify(RuntimeError("boom"))
    assert isinstance(outcome, Ambiguous)
    assert (outcome.code, outcome.detail) == ("RuntimeError", "unclassified exception")


@pytest.mark.parametrize(
    "outcome",
    [TerminalFailure("no"), RetryLater("later"), Ambiguous("maybe"), Quarantine("unreadable")],
)
def test_a_handler_outcome_is_returned_as_it_is(outcome: HandlerOutcome) -> None:
    assert classify(outcome) is outcome


def test_a_custom_table_replaces_the_default() -> None:
    table = ((KeyError, OutcomeKind.RETRY),)
    assert isinstance(classify(KeyError("x"), table), RetryLater)
    assert isinstance(classify(ValueError(), table), Ambiguous), "not in the custom table"


def test_outcome_messages_carry_code_and_detail() -> None:
    assert str(TerminalFailure("refused")) == "refused"
    assert str(TerminalFailure("refused", "account closed")) == "refused: account closed"
    assert RetryLater().code == "retry"
    assert RetryLater(delay=timedelta(seconds=3)).delay == timedelta(seconds=3)


# -- as_success ----------------------------------------------------------------------------------


def test_none_is_success_and_a_success_is_kept() -> None:
    assert as_success(None) == Success("ok")
    done = Success("charged", "ch_1")
    assert as_success(done) is done


@pytest.mark.parametrize("value", ["ok", True, 0, {"code": "ok"}])
def test_any_other_return_value_is_a_type_error(value: object) -> None:
    with pytest.raises(TypeError, match="returns None or Success"):
        as_success(value)


# -- backoff -------------------------------------------------------------------------------------

POLICY = RetryPolicy(backoff_initial=timedelta(seconds=1), backoff_max=timedelta(seconds=60))


def ceiling(policy: RetryPolicy, attempt: int) -> float:
    doubled: float = policy.backoff_initial.total_seconds() * 2 ** max(attempt - 1, 0)
    return min(policy.backoff_max.total_seconds(), doubled)


@given(
    attempt=st.integers(min_value=0, max_value=200),
    initial=st.integers(min_value=0, max_value=10_000),
    cap=st.integers(min_value=0, max_value=100_000),
    seed=st.integers(),
)
def test_backoff_is_within_zero_and_its_ceiling(
    attempt: int, initial: int, cap: int, seed: int
) -> None:
    policy = RetryPolicy(
        backoff_initial=timedelta(milliseconds=initial), backoff_max=timedelta(milliseconds=cap)
    )
    delay = backoff(policy, attempt, random.Random(seed)).total_seconds()
    assert 0 <= delay <= ceiling(policy, attempt) + 1e-6
    assert delay <= policy.backoff_max.total_seconds() + 1e-6


class Extreme(random.Random):
    """Draws the upper (or lower) end of every range: the ceiling itself."""

    def __init__(self, upper: bool) -> None:
        super().__init__(0)
        self.upper = upper

    def uniform(self, a: float, b: float) -> float:
        return b if self.upper else a


def test_backoff_ceiling_doubles_per_attempt_up_to_the_cap() -> None:
    top = [backoff(POLICY, n, Extreme(upper=True)).total_seconds() for n in range(1, 9)]
    assert top == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff(POLICY, 5, Extreme(upper=False)) == timedelta(0)


def test_backoff_is_jittered() -> None:
    rng = random.Random(7)
    draws = {backoff(POLICY, 6, rng) for _ in range(50)}
    assert len(draws) > 40, "full jitter: draws spread over [0, ceiling]"


# -- the context ---------------------------------------------------------------------------------


def context(**overrides: object) -> Context:
    fields: dict[str, object] = {
        "tenant_id": "t1",
        "operation_id": "op-1",
        "job_type": "refund",
        "subscription": "refunds",
        "attempt": 1,
        "max_attempts": 5,
        "fence": 3,
        "payload": b'{"amount": 12}',
    }
    return Context(**{**fields, **overrides})  # type: ignore[arg-type]


def test_progress_is_taken_once_and_can_be_restored() -> None:
    ctx = context()
    assert ctx.take_progress() is False
    ctx.progress()
    ctx.progress()
    assert ctx.take_progress() is True
    assert ctx.take_progress() is False, "taken: the next renewal needs new progress"
    ctx.restore_progress()
    assert ctx.take_progress() is True


def test_progress_after_the_lease_is_lost_raises_lease_lost() -> None:
    calls: list[None] = []
    ctx = context(_on_progress=lambda: calls.append(None))
    ctx.progress()
    ctx.lease_lost.set()
    with pytest.raises(LeaseLost) as lost:
        ctx.progress()
    assert (lost.value.fence, lost.value.action) == (3, "progress")
    assert "op-1" not in str(lost.value), "identifiers stay out of messages"
    assert len(calls) == 1


def test_json_parses_the_payload_and_unreadable_payloads_classify_as_quarantine() -> None:
    assert context().json() == {"amount": 12}
    with pytest.raises(json.JSONDecodeError) as bad:
        context(payload=b"{not json").json()
    assert isinstance(classify(bad.value), Quarantine)
    with pytest.raises(UnicodeDecodeError) as undecodable:
        context(payload=b"\xff\xfe\xfa").json()
    assert isinstance(classify(undecodable.value), Quarantine)


def test_a_lease_flag_behaves_as_an_event_for_a_waiter_on_another_thread() -> None:
    flag = LeaseFlag()
    assert not flag.is_set()
    assert flag.wait(0.01) is False
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(flag.wait(10)))
    waiter.start()
    flag.set()
    waiter.join(10)
    assert woke == [True]
    assert flag.is_set()
    assert flag.wait(0) is True  # already set: no wait
    flag.clear()
    assert not flag.is_set()
    assert flag.wait(0.01) is False


def test_a_lease_flag_set_before_anyone_waits_is_seen_by_the_first_wait() -> None:
    flag = LeaseFlag()
    flag.set()
    assert flag.wait(0) is True
