"""Class C example: charge a customer through a payment provider with idempotency keys.

This is **dedupe, not fencing**. The provider cannot see fences; what keeps a charge single is
the idempotency key (stable, tenant-scoped, opaque: derived from the operation, never from an
attempt) and the provider's promise about repeated keys, for as long as it keeps them. The
executor adds reconcile-before-retry: after an ambiguous attempt, and on every claim after the
first, it calls :meth:`ChargeCustomer.lookup` before charging again.

How the provider's answers map onto outcomes:

========================================  ===============================================
``charge``                                outcome
========================================  ===============================================
200 (new, or replayed under the key)      success, the charge id as detail
409, the key's first request in flight    retry later: nothing new was applied
429 (rate limited)                        rate limited: the charge type and tenant wait out
                                          ``Retry-After``, no attempt used
400 / 422 and other 4xx                   terminal failure: retrying cannot succeed
timeout, connection reset, 5xx            ambiguous: the executor looks the key up
========================================  ===============================================

A 429 means the provider refused the request before acting, so it is an explicit answer, not
an ambiguous one. ``Retry-After`` is read as integer seconds or an HTTP-date
(:func:`retry_after`); a missing or unreadable header waits :data:`RETRY_AFTER_DEFAULT`, and no
wait is longer than :data:`RETRY_AFTER_MAX` (a provider's mistake, or a date far ahead, must
not park a tenant's charges for hours: past the cap the next attempt simply asks again).

``lookup`` answers applied (the charge id), not applied (404), or cannot tell (503, a timeout,
a broken connection, a charge under the key that does not match this payload).

Payload (JSON)::

    {"amount": 1200, "currency": "eur", "reference": "order-1042"}

Built by ``fencebridge run`` (or ``check``) from
``handler = "bridge.demo.payments:ChargeCustomer"``, the class takes no argument and reads the
provider's URL from ``FENCEBRIDGE_DEMO_PROVIDER_URL`` (``fencebridge demo --keep`` writes it to
its env file): settings come from the environment, as secrets would.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

from bridge.demo.provider import (
    ChargeResult,
    PaymentClient,
    ProviderAmbiguous,
    ProviderConflict,
    ProviderError,
    ProviderRateLimited,
    ProviderRejected,
    ProviderServerError,
    ProviderTimeout,
)
from bridge.errors import ConfigError
from bridge.handlers import (
    Ambiguous,
    Applied,
    CannotTell,
    Context,
    IdempotentApiHandler,
    NotApplied,
    Quarantine,
    RateLimited,
    RetryLater,
    Success,
    TerminalFailure,
)

JOB_TYPE = "charge_customer"
#: the payment provider's base URL, for a handler built from the configuration
PROVIDER_URL_ENV = "FENCEBRIDGE_DEMO_PROVIDER_URL"
#: the wait when a 429 carries no ``Retry-After`` the handler can read
RETRY_AFTER_DEFAULT = timedelta(seconds=1)
#: the longest wait a ``Retry-After`` can ask for; longer ones are cut to it
RETRY_AFTER_MAX = timedelta(seconds=300)


def retry_after(header: str | None, now: datetime | None = None) -> timedelta:
    """The wait a ``Retry-After`` header asks for: integer seconds or an HTTP-date.

    Missing or unreadable: :data:`RETRY_AFTER_DEFAULT`; a date in the past: no wait; never more
    than :data:`RETRY_AFTER_MAX`. ``now`` is for tests (default: the current UTC time).
    """
    if header is None or not (text := header.strip()):
        return RETRY_AFTER_DEFAULT
    if text.isascii() and text.isdigit():
        wait = timedelta(seconds=int(text)) if len(text) <= 9 else RETRY_AFTER_MAX
    else:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return RETRY_AFTER_DEFAULT
        if when.tzinfo is None:  # "-0000": UTC by RFC 5322, and HTTP-dates are GMT
            when = when.replace(tzinfo=UTC)
        wait = max(when - (now or datetime.now(UTC)), timedelta(0))
    return min(wait, RETRY_AFTER_MAX)


@dataclass(frozen=True, slots=True)
class ChargeRequest:
    amount: int
    currency: str
    reference: str | None

    @classmethod
    def of(cls, ctx: Context) -> ChargeRequest:
        """Read the payload, or quarantine it: an amount is never guessed."""
        data = ctx.json()
        if not isinstance(data, dict):
            raise Quarantine("invalid_payload", "the payload must be a JSON object")
        amount, currency, reference = (data.get(k) for k in ("amount", "currency", "reference"))
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
            raise Quarantine("invalid_payload", "amount must be a positive integer (minor units)")
        if not isinstance(currency, str) or len(currency) != 3 or not currency.isalpha():
            raise Quarantine("invalid_payload", "currency must be a three-letter code")
        if reference is not None and not isinstance(reference, str):
            raise Quarantine("invalid_payload", "reference must be a string")
        return cls(amount, currency.lower(), reference)

    def body(self) -> dict[str, object]:
        """The request body: the same bytes on every attempt, as the provider requires."""
        body: dict[str, object] = {"amount": self.amount, "currency": self.currency}
        if self.reference is not None:
            body["reference"] = self.reference
        return body

    def matches(self, charge: ChargeResult) -> bool:
        return (charge.amount, charge.currency.lower()) == (self.amount, self.currency)


class ChargeCustomer(IdempotentApiHandler):
    """Charge once per operation; look the key up whenever an earlier attempt may have acted."""

    def __init__(self, client: PaymentClient | None = None) -> None:
        self._client = client or _client_from_env()

    def validate(self, ctx: Context) -> None:
        """Before anything is sent: a payload it cannot read is quarantined, never charged."""
        ChargeRequest.of(ctx)

    def perform(self, ctx: Context, key: str) -> Success:
        request = ChargeRequest.of(ctx)
        try:
            charge = self._client.charge(key, request.body())
        except ProviderConflict as exc:
            detail = "a request with this key is still in flight"
            raise RetryLater("provider_in_progress", detail) from exc
        except ProviderRateLimited as exc:
            wait = retry_after(exc.retry_after)
            raise RateLimited(detail="the provider answered 429", retry_after=wait) from exc
        except ProviderRejected as exc:
            raise TerminalFailure(
                exc.error_type or "provider_rejected", f"the provider answered {exc.status}"
            ) from exc
        except ProviderAmbiguous as exc:
            raise Ambiguous(_ambiguous_code(exc)) from exc
        return Success("charged", charge.id)

    def lookup(self, ctx: Context, key: str) -> Applied | NotApplied:
        request = ChargeRequest.of(ctx)
        try:
            charge = self._client.lookup(key)
        except ProviderError as exc:  # 503, 409 in flight, transport errors: no answer
            raise CannotTell(type(exc).__name__) from exc
        if charge is None:
            return NotApplied()
        if not request.matches(charge):
            # Our key, another charge: a person must look; neither answer would be honest.
            raise CannotTell("the charge under this key does not match the payload")
        return Applied("charged", charge.id)


def _client_from_env() -> PaymentClient:
    url = os.environ.get(PROVIDER_URL_ENV, "")
    if not url:
        raise ConfigError(
            f"ChargeCustomer needs the payment provider's URL in {PROVIDER_URL_ENV}: source the "
            "env file `fencebridge demo --keep` wrote, or set it to the provider's http:// URL"
        )
    try:
        return PaymentClient(url, timeout=1.0)
    except ValueError as exc:
        raise ConfigError(f"{PROVIDER_URL_ENV}: {exc}") from exc


def _ambiguous_code(exc: ProviderAmbiguous) -> str:
    if isinstance(exc, ProviderTimeout):
        return "provider_timeout"
    if isinstance(exc, ProviderServerError):
        return "provider_server_error"
    return "provider_connection_error"
