"""The SQS receive loop's pause after failures: tenacity's full-jitter exponential, capped.

It used to be ``0.2 * 2**failures``, which raises ``OverflowError`` past 1,023 failures in a row:
the receive thread then died in its own error handler.
"""

from __future__ import annotations

import random

import pytest
from tenacity import RetryCallState, Retrying

from consumers.sqs.source import BACKOFF_INITIAL, BACKOFF_MAX, receive_backoff


def pauses(attempt: int, n: int = 400) -> list[float]:
    wait = receive_backoff()
    state = RetryCallState(retry_object=Retrying(), fn=None, args=(), kwargs={})
    state.attempt_number = attempt
    return [wait(state) for _ in range(n)]


@pytest.mark.parametrize("attempt", [1024, 1025, 5000, 10**6])
def test_the_pause_stays_capped_after_any_number_of_failures(attempt: int) -> None:
    random.seed(attempt)
    found = pauses(attempt)
    assert all(0 <= p <= BACKOFF_MAX for p in found)
    # Full jitter: anywhere from nothing to the cap, so replicas do not retry in step.
    assert min(found) < BACKOFF_MAX * 0.1
    assert max(found) > BACKOFF_MAX * 0.9


def test_the_pause_grows_exponentially_from_the_initial_one() -> None:
    random.seed(1)
    for attempt in range(1, 6):
        ceiling = BACKOFF_INITIAL * 2 ** (attempt - 1)
        assert max(pauses(attempt)) <= ceiling
    assert max(pauses(6)) > BACKOFF_INITIAL * 2**4  # the ceiling doubled again
