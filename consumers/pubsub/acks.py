"""Pub/Sub's unary ack calls, answered ack id by ack id (exactly-once delivery).

With exactly-once delivery the service answers an ``Acknowledge`` or ``ModifyAckDeadline``
call per ack id: confirmed, refused for good (``PERMANENT_FAILURE_INVALID_ACK_ID``: the ack id
expired and the message went out again) or refused for now (``TRANSIENT_*``, among them
``TRANSIENT_FAILURE_UNORDERED_ACK_ID``: with message ordering, a copy whose ordering key has
copies delivered before it that are not acknowledged yet). :class:`AckCalls` sorts each call's
ack ids by that answer, for :func:`~bridge.adapters.kit.confirm` and the
:class:`~bridge.adapters.kit.Holder` to retry what may still be confirmed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final, Protocol, TypeVar

from google.api_core import exceptions as api_exceptions

from bridge.adapters.kit import CallResult

log = logging.getLogger(__name__)

#: ack ids per Acknowledge / ModifyAckDeadline call
ACK_BATCH: Final = 500
INVALID_ACK_ID: Final = "PERMANENT_FAILURE_INVALID_ACK_ID"
#: the service's reason for an ack refused until the copies delivered before it are acked
UNORDERED: Final = "TRANSIENT_FAILURE_UNORDERED_ACK_ID"
#: refusals that no retry can change
_PERMANENT_CODES: Final = (
    api_exceptions.NotFound,
    api_exceptions.PermissionDenied,
    api_exceptions.FailedPrecondition,
)


class _AckId(Protocol):
    @property
    def handle(self) -> str: ...


A = TypeVar("A", bound=_AckId)


class AckCalls:
    """Acknowledge and ModifyAckDeadline as unary calls, answered per ack id.

    ``unordered`` is told of the copies whose acks the service refused as out of order.
    """

    max_batch = ACK_BATCH

    def __init__(
        self,
        client: Any,
        subscription_path: str,
        unordered: Callable[[Sequence[Any]], None] | None = None,
    ) -> None:
        self._client = client
        self._path = subscription_path
        self._unordered = unordered

    def settle(self, held: Sequence[A]) -> CallResult[A]:
        """Acknowledge, the ack ids in the order given (callers give delivery order: with
        message ordering the service confirms a copy only after the copies before it of its
        ordering key, and refuses every later copy of the key in a call once it refused one).

        When ack ids are refused as out of order all the same, the first of them is sent again
        on its own, after the others: two copies the wrong way round in one call would
        otherwise be refused together at every retry.
        """
        result, refused = _answered(held, partial(self._acknowledge, held))
        unordered = [h for h in result.retry if refused.get(h.handle) == UNORDERED]
        if unordered and self._unordered is not None:
            self._unordered(unordered)
        if len(unordered) < 2:
            return result
        first, others = unordered[0], unordered[1:]
        rest, _ = _answered(others, partial(self._acknowledge, others), quiet=True)
        alone, _ = _answered([first], partial(self._acknowledge, [first]), quiet=True)
        # What is still unconfirmed is tried again in the order given.
        still = {h.handle for h in (*rest.retry, *alone.retry)}
        again = {h.handle for h in unordered}
        return CallResult(
            done=[*result.done, *rest.done, *alone.done],
            lost=[*result.lost, *rest.lost, *alone.lost],
            retry=[h for h in result.retry if h.handle not in again or h.handle in still],
        )

    def _acknowledge(self, held: Sequence[A]) -> None:
        self._client.acknowledge(
            request={"subscription": self._path, "ack_ids": [h.handle for h in held]},
            retry=None,
            timeout=30,
        )

    def extend(self, held: Sequence[A], seconds: float) -> CallResult[A]:
        return self._modify(held, int(seconds))

    def release(self, held: Sequence[A]) -> None:
        self._modify(held, 0)

    def _modify(self, held: Sequence[A], seconds: int) -> CallResult[A]:
        def modify() -> None:
            self._client.modify_ack_deadline(
                request={
                    "subscription": self._path,
                    "ack_ids": [h.handle for h in held],
                    "ack_deadline_seconds": seconds,
                },
                retry=None,
                timeout=30,
            )

        return _answered(held, modify)[0]


def _answered(
    held: Sequence[A], call: Any, *, quiet: bool = False
) -> tuple[CallResult[A], Mapping[str, str]]:
    """Run an ack or modack call and sort its ack ids by the service's answer; also returns
    the service's reason for each ack id it refused (exactly-once only)."""
    try:
        call()
    except api_exceptions.GoogleAPICallError as exc:
        exactly_once = exc.reason == "EXACTLY_ONCE_ACKID_FAILURE"
        per_id: Mapping[str, str] = (exc.metadata or {}) if exactly_once else {}
        # The service's reasons only (codes such as TRANSIENT_FAILURE_UNORDERED_ACK_ID).
        reasons = ",".join(sorted(set(per_id.values()))) or "no reasons"
        log.log(
            logging.DEBUG if quiet else logging.INFO,
            "ack or deadline call not confirmed: %s [%s]",
            describe(exc),
            reasons,
        )
        if per_id:
            # Exactly-once: the service lists the ack ids it refused, each with why; it applied
            # every other one of the call.
            answers = [(h, per_id.get(h.handle, "")) for h in held]
            return CallResult(
                done=[h for h, why in answers if not why],
                lost=[h for h, why in answers if why.startswith("PERMANENT_")],
                retry=[h for h, why in answers if why and not why.startswith("PERMANENT_")],
            ), per_id
        if isinstance(exc, _PERMANENT_CODES):
            return CallResult(lost=list(held)), {}
        return CallResult(retry=list(held)), {}
    except ValueError:
        # The client library could not read the service's error (its status and details
        # disagree): unconfirmed, so try again.
        log.info("ack or deadline call answered with an unreadable error")
        return CallResult(retry=list(held)), {}
    return CallResult(done=list(held)), {}


def describe(exc: BaseException) -> str:
    """An error as a log line may show it: its kind and status, never message contents."""
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        code = exc.grpc_status_code
        status = code.name if code is not None else type(exc).__name__
        detail = (exc.message or "").splitlines()[0][:200] if exc.message else ""
        return f"{status} ({detail})" if detail else status
    if isinstance(exc, api_exceptions.RetryError):
        cause = exc.cause
        return f"retries exhausted ({describe(cause)})" if cause else "retries exhausted"
    return type(exc).__name__
