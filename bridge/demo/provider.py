"""A payment provider on loopback: the class C target of fencebridge's tests and demo.

It speaks a small Stripe-like HTTP API whose idempotency keys behave the way a real provider's
do, and it can be told to fail in the ways that make a side effect *ambiguous*. Its ledger is
the evidence: it says how many charges really happened, whatever the client believed.

Endpoints::

    POST   /v1/charges                        Idempotency-Key: <key>   {"amount": 1200, ...}
    GET    /v1/charges?idempotency_key=<key>  lookup by key; never creates anything
    GET    /_ledger                           every charge, in creation order
    GET    /_faults | POST /_faults | DELETE /_faults

What a key promises (as Stripe's do):

* first valid request → one charge, ``200``; the response is stored under the key;
* same key, same body (compared in canonical JSON) → the stored response again, byte for byte,
  with ``Idempotent-Replayed: true``; no new charge;
* same key, another body → ``422`` ``idempotency_error``; no new charge;
* same key while its first request is still processing → ``409``; no charge;
* no key, a key over 255 characters, invalid JSON or amount → ``400``; nothing is stored, so
  the key stays free.

A lookup answers ``200`` with the stored charge, ``404`` ``not_found`` if the key was never
applied, and ``409`` while the key's first request is still processing (it cannot say "not
applied" about a charge that may land a moment later).

Faults are switched at runtime (:meth:`PaymentProvider.set_fault` or ``POST /_faults``), each
for ``times`` requests (default 1) and optionally for one key only:

====================  ============================================================
apply_then_timeout    apply, hold the response ``seconds`` (default 10), then close
apply_then_500        apply, then answer 500 (the stored response stays the 200)
reset_before_apply    close with a TCP RST before the key is even looked at
reset_after_apply     apply, then close with a TCP RST
slow                  sleep ``seconds`` (default 1) while the key is processing
late_apply            hold the request ``seconds`` (default 10) before the key is looked
                      at, as a request still on its way would be (a lookup meanwhile
                      finds nothing), then apply it: the charge lands after its client
                      gave up
lookup_unavailable    lookups answer 503: the "cannot tell" case
rate_limited          answer 429 before the key is looked at (nothing applied, nothing
                      stored), with ``Retry-After: <retry_after>`` (default ``1``; any text
                      is sent as it is, an HTTP-date or garbage included; null sends none)
====================  ============================================================

"Apply" is the key's ordinary handling: on a replay a fault hits the replayed response.

:class:`PaymentClient` is the matching client. It sorts every outcome into one exception
that says what the caller may do next::

    ProviderError                   never raised itself
    ├── ProviderAmbiguous           the charge may or may not have happened: look it up by key
    │   ├── ProviderTimeout         no answer within the timeout
    │   ├── ProviderConnectionError connection refused, reset or closed mid-answer
    │   └── ProviderServerError     5xx, or a 200 that cannot be read
    ├── ProviderConflict            409: the key's first request is still processing; retry later
    ├── ProviderRateLimited         429: refused before acting; ``retry_after`` is the header
    ├── ProviderRejected            400/422 and other 4xx: terminal; this request applied nothing
    └── ProviderUnavailable         a lookup could not tell (503, 5xx, timeout, connection)

Run alone with ``python -m bridge.demo.provider --port 8080``: it prints its URL once
listening and exits cleanly on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import enum
import hashlib
import http.client
import json
import signal
import socket
import struct
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self, cast
from urllib.parse import parse_qs, urlencode, urlsplit

IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255
MAX_BODY_BYTES = 1 << 20
DEFAULT_SLOW_SECONDS = 1.0
DEFAULT_HOLD_SECONDS = 10.0
IN_PROGRESS_MESSAGE = "a request with this key is still being processed"
RETRY_AFTER_HEADER = "Retry-After"
#: the ``Retry-After`` a ``rate_limited`` fault sends unless it names another
DEFAULT_RETRY_AFTER = "1"


# -- the provider's rules ---------------------------------------------------------------------


def canonical_hash(body: object) -> str:
    """sha256 of the body in canonical JSON: key order and whitespace do not make a new body."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def charge_error(body: object) -> str | None:
    """Why a charge request body is invalid, or None if it is valid."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    amount = body.get("amount")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        return "amount must be a positive integer (minor units)"
    currency = body.get("currency")
    if not isinstance(currency, str) or len(currency) != 3 or not currency.isalpha():
        return "currency must be a three-letter code"
    if not isinstance(body.get("reference", ""), str | None):
        return "reference must be a string"
    return None


class FaultKind(enum.StrEnum):
    """The ways the provider can be told to misbehave."""

    APPLY_THEN_TIMEOUT = "apply_then_timeout"
    APPLY_THEN_500 = "apply_then_500"
    RESET_BEFORE_APPLY = "reset_before_apply"
    RESET_AFTER_APPLY = "reset_after_apply"
    SLOW = "slow"
    LATE_APPLY = "late_apply"
    LOOKUP_UNAVAILABLE = "lookup_unavailable"
    RATE_LIMITED = "rate_limited"

    @property
    def on_lookup(self) -> bool:
        """Lookup faults hit ``GET /v1/charges``; the others hit ``POST /v1/charges``."""
        return self is FaultKind.LOOKUP_UNAVAILABLE


#: faults that answer before the key is looked at: nothing applied, nothing stored
_BEFORE_APPLY = frozenset({FaultKind.RESET_BEFORE_APPLY, FaultKind.RATE_LIMITED})

_DEFAULT_SECONDS = {
    FaultKind.SLOW: DEFAULT_SLOW_SECONDS,
    FaultKind.APPLY_THEN_TIMEOUT: DEFAULT_HOLD_SECONDS,
    FaultKind.LATE_APPLY: DEFAULT_HOLD_SECONDS,
}


@dataclass(frozen=True, slots=True)
class Fault:
    """One armed fault: it hits the next ``times`` matching requests, then disarms."""

    kind: FaultKind
    times: int = 1
    #: Only requests with this idempotency key; None hits any key.
    key: str | None = None
    #: How long ``slow`` sleeps and ``apply_then_timeout`` and ``late_apply`` hold; None for
    #: the default.
    seconds: float | None = None
    #: The ``Retry-After`` header of a ``rate_limited`` answer, sent as it is; None sends none.
    retry_after: str | None = DEFAULT_RETRY_AFTER

    def __post_init__(self) -> None:
        if not isinstance(self.kind, FaultKind):
            raise ValueError(f"unknown fault kind {self.kind!r}")
        if not isinstance(self.times, int) or isinstance(self.times, bool) or self.times < 1:
            raise ValueError("times must be a positive integer")
        if self.key is not None and not isinstance(self.key, str):
            raise ValueError("key must be a string or null")
        if self.seconds is not None:
            if self.kind not in _DEFAULT_SECONDS:
                raise ValueError(f"seconds does not apply to {self.kind.value}")
            if not isinstance(self.seconds, int | float) or isinstance(self.seconds, bool):
                raise ValueError("seconds must be a number")
            if not self.seconds > 0:
                raise ValueError("seconds must be positive")
        if self.retry_after is not None and not isinstance(self.retry_after, str):
            raise ValueError("retry_after must be a string or null")
        if self.kind is not FaultKind.RATE_LIMITED and self.retry_after != DEFAULT_RETRY_AFTER:
            raise ValueError(f"retry_after does not apply to {self.kind.value}")

    @property
    def delay(self) -> float:
        return self.seconds if self.seconds is not None else _DEFAULT_SECONDS.get(self.kind, 0.0)

    @classmethod
    def from_json(cls, data: object) -> Fault:
        """Read the body of ``POST /_faults``; ValueError names what is wrong with it."""
        if not isinstance(data, dict):
            raise ValueError("a fault is a JSON object")
        unknown = set(data) - {"kind", "times", "key", "seconds", "retry_after"}
        if unknown:
            raise ValueError(f"unknown fault fields: {', '.join(sorted(unknown))}")
        try:
            kind = FaultKind(str(data.get("kind")))
        except ValueError:
            raise ValueError(f"unknown fault kind {data.get('kind')!r}") from None
        retry_after = data.get("retry_after", DEFAULT_RETRY_AFTER)
        return cls(kind, data.get("times", 1), data.get("key"), data.get("seconds"), retry_after)

    def to_json(self) -> dict[str, object]:
        shown: dict[str, object] = {
            "kind": self.kind.value,
            "times": self.times,
            "key": self.key,
            "seconds": self.seconds,
        }
        if self.kind is FaultKind.RATE_LIMITED:
            shown["retry_after"] = self.retry_after
        return shown


@dataclass(frozen=True, slots=True)
class Charge:
    """One entry of the ledger: a charge that really happened."""

    #: 1-based creation order across the whole ledger.
    order: int
    id: str
    idempotency_key: str
    amount: int
    currency: str
    reference: str | None
    #: :func:`canonical_hash` of the request body that created it.
    body_hash: str


@dataclass(slots=True)
class _KeyRecord:
    body_hash: str
    #: The stored 200 body; None while the key's first request is still processing.
    response: bytes | None = None


class _Decision(enum.Enum):
    NEW = "new"  # the key is reserved for this request: create the charge
    REPLAY = "replay"
    MISMATCH = "mismatch"  # 422
    IN_PROGRESS = "in_progress"  # 409
    SKIP = "skip"  # reset_before_apply: the key is never looked at
    LATE = "late"  # late_apply: the key is looked at once the request arrives


def _error_body(error_type: str, message: str) -> bytes:
    return json.dumps({"error": {"type": error_type, "message": message}}).encode()


def _answer(decision: _Decision, stored: bytes) -> tuple[HTTPStatus, list[tuple[str, str]], bytes]:
    """Status, headers and body for a charge request whose key was looked at; ``stored`` is the
    key's stored response (the new charge's, for a new key)."""
    if decision is _Decision.NEW:
        return HTTPStatus.OK, [], stored
    if decision is _Decision.REPLAY:
        return HTTPStatus.OK, [(REPLAYED_HEADER, "true")], stored
    if decision is _Decision.MISMATCH:
        message = "this key was used with a different request body; use a new key"
        return HTTPStatus.UNPROCESSABLE_ENTITY, [], _error_body("idempotency_error", message)
    return HTTPStatus.CONFLICT, [], _error_body("idempotency_error", IN_PROGRESS_MESSAGE)


# -- the server -------------------------------------------------------------------------------


class PaymentProvider:
    """The provider in a background thread of this process (or of its own, see :func:`main`).

    All state is in memory, guarded by one lock; every handler thread goes through it.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._address = (host, port)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._keys: dict[str, _KeyRecord] = {}
        self._charges: list[Charge] = []
        self._requests: Counter[str] = Counter()
        self._lookups: Counter[str] = Counter()
        self._faults: list[Fault] = []
        #: late_apply requests that have not arrived yet
        self._late = 0
        #: wakes the late_apply requests on their way (a release, or the provider stopping)
        self._arrivals = threading.Condition(self._lock)
        self._released = 0  # how many times release_late was called
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # lifecycle

    def start(self) -> Self:
        """Bind and serve in a background thread. Raises OSError if the address is taken."""
        if self._server is not None:
            raise RuntimeError("the provider is already started")
        self._stopping.clear()
        server = _Server(self._address, _Handler)
        server.provider = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},  # how soon stop() is noticed
            name="payment-provider",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; held and slow requests are released at once. Idempotent."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self._stopping.set()
        with self._lock:
            self._arrivals.notify_all()
        server.shutdown()
        server.server_close()  # joins the handler threads; none of them waits on a timer now
        thread.join()
        self._server = self._thread = None

    @property
    def url(self) -> str:
        """``http://host:port`` of the running provider."""
        if self._server is None:
            raise RuntimeError("the provider is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # faults

    def set_fault(
        self,
        kind: FaultKind | str,
        *,
        times: int = 1,
        key: str | None = None,
        seconds: float | None = None,
        retry_after: str | None = DEFAULT_RETRY_AFTER,
    ) -> Fault:
        """Arm a fault for the next ``times`` matching requests (faults armed earlier go first)."""
        return self._arm(Fault(FaultKind(kind), times, key, seconds, retry_after))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def faults(self) -> list[Fault]:
        """The armed faults, with the requests each has left."""
        with self._lock:
            return list(self._faults)

    # evidence

    def ledger(self) -> list[Charge]:
        """Every charge that happened, in creation order."""
        with self._lock:
            return list(self._charges)

    def charges_for(self, key: str) -> int:
        """How many charges exist for the key: 0 or 1, which is what tests of a client assert."""
        with self._lock:
            return sum(1 for c in self._charges if c.idempotency_key == key)

    def requests_for(self, key: str) -> int:
        """How many charge requests arrived with this key, whatever became of them."""
        with self._lock:
            return self._requests[key]

    def lookups_for(self, key: str) -> int:
        """How many lookups asked about this key."""
        with self._lock:
            return self._lookups[key]

    def late(self) -> int:
        """Requests a ``late_apply`` fault still holds: they have not been applied yet."""
        with self._lock:
            return self._late

    def release_late(self) -> None:
        """Let every request a ``late_apply`` fault holds arrive now, whatever its ``seconds``:
        a test decides when the requests on their way land."""
        with self._lock:
            self._released += 1
            self._arrivals.notify_all()

    # what the handler threads call

    def _take_fault(self, key: str, *, lookup: bool) -> Fault | None:
        """The first armed fault that matches; one of its ``times`` is used up. Caller locks."""
        for i, fault in enumerate(self._faults):
            if fault.kind.on_lookup == lookup and fault.key in (None, key):
                if fault.times == 1:
                    del self._faults[i]
                else:
                    self._faults[i] = replace(fault, times=fault.times - 1)
                return fault
        return None

    def _arm(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def _count_request(self, key: str) -> None:
        with self._lock:
            self._requests[key] += 1

    def _begin_charge(self, key: str, body_hash: str) -> tuple[Fault | None, _Decision, bytes]:
        """Take the request's fault and decide what the key means, in one critical section.

        Deciding under the same lock as the fault is taken makes the request that drew a
        ``slow`` fault the one that holds a fresh key while it sleeps. ``reset_before_apply``
        gets no decision (SKIP): the connection dies before the key is looked at. The bytes
        are the stored response of a replay, empty otherwise.
        """
        with self._lock:
            fault = self._take_fault(key, lookup=False)
            if fault is not None and fault.kind in _BEFORE_APPLY:
                return fault, _Decision.SKIP, b""
            if fault is not None and fault.kind is FaultKind.LATE_APPLY:
                self._late += 1
                return fault, _Decision.LATE, b""
            return (fault, *self._decide(key, body_hash))

    def _decide(self, key: str, body_hash: str) -> tuple[_Decision, bytes]:
        """What the key means for a request that has arrived. Caller locks."""
        record = self._keys.get(key)
        if record is None:
            self._keys[key] = _KeyRecord(body_hash)
            return _Decision.NEW, b""
        if record.body_hash != body_hash:
            return _Decision.MISMATCH, b""
        if record.response is None:
            return _Decision.IN_PROGRESS, b""
        return _Decision.REPLAY, record.response

    def _arrive(
        self, key: str, body: Mapping[str, Any], body_hash: str, delay: float
    ) -> tuple[_Decision, bytes] | None:
        """A ``late_apply`` request arrives after ``delay`` and is handled as any other, its
        charge created (the answer of a new key) before anything is sent to a client that has
        gone. None when the provider stopped first: the request is lost with it."""
        try:
            with self._lock:
                released = self._released
                self._arrivals.wait_for(
                    lambda: self._stopping.is_set() or self._released != released, delay
                )
                if self._stopping.is_set():
                    return None
                decision, stored = self._decide(key, body_hash)
            if decision is _Decision.NEW:
                stored = self._apply_charge(key, body, body_hash)
            return decision, stored
        finally:
            with self._lock:
                self._late -= 1

    def _apply_charge(self, key: str, body: Mapping[str, Any], body_hash: str) -> bytes:
        """Create the one charge for a key reserved by :meth:`_begin_charge`; store the answer."""
        with self._lock:
            charge = Charge(
                order=len(self._charges) + 1,
                id=f"ch_{uuid.uuid4().hex[:24]}",
                idempotency_key=key,
                amount=body["amount"],
                currency=body["currency"].lower(),
                reference=body.get("reference"),
                body_hash=body_hash,
            )
            response = json.dumps(
                {
                    "id": charge.id,
                    "object": "charge",
                    "amount": charge.amount,
                    "currency": charge.currency,
                    "reference": charge.reference,
                    "status": "succeeded",
                    "idempotency_key": key,
                }
            ).encode()
            self._charges.append(charge)
            self._keys[key].response = response
            return response

    def _begin_lookup(self, key: str) -> tuple[Fault | None, _KeyRecord | None]:
        """Count the lookup and take its fault; a copy of the key's record, if there is one."""
        with self._lock:
            self._lookups[key] += 1
            fault = self._take_fault(key, lookup=True)
            record = self._keys.get(key)
            return fault, None if record is None else replace(record)

    def _wait(self, seconds: float) -> None:
        """Sleep, unless the provider is stopping."""
        self._stopping.wait(seconds)


class _Server(ThreadingHTTPServer):
    provider: PaymentProvider
    request_queue_size = 128  # the default 5 resets connections in a burst of concurrent clients

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout, reset) is part of the game, not a server error.
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server_version = "PaymentProvider/1"
    timeout = 10  # a client that connects and never sends cannot hold stop() forever

    @property
    def _provider(self) -> PaymentProvider:
        return cast(_Server, self.server).provider

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: requests carry idempotency keys, and tests make thousands of them."""

    # routing

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if path == "/v1/charges":
            self._charge()
        elif path == "/_faults":
            self._arm_fault()
        else:
            self._no_route()

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        if parts.path == "/v1/charges":
            self._lookup(parse_qs(parts.query).get("idempotency_key", [""])[0])
        elif parts.path == "/_ledger":
            self._send_json(HTTPStatus.OK, [asdict(c) for c in self._provider.ledger()])
        elif parts.path == "/_faults":
            self._send_faults()
        else:
            self._no_route()

    def do_DELETE(self) -> None:
        if urlsplit(self.path).path == "/_faults":
            self._provider.clear_faults()
            self._send_faults()
        else:
            self._no_route()

    # charges

    def _charge(self) -> None:
        request = self._charge_request()
        if request is None:
            return
        key, body = request
        provider = self._provider
        body_hash = canonical_hash(body)
        fault, decision, stored = provider._begin_charge(key, body_hash)
        if decision is _Decision.SKIP:
            self._refuse(fault)
            return
        applied = False
        if decision is _Decision.LATE:
            assert fault is not None
            arrived = provider._arrive(key, body, body_hash, fault.delay)
            if arrived is None:
                self._reset()
                return
            (decision, stored), applied, fault = arrived, True, None
        kind = fault.kind if fault is not None else None
        if fault is not None and kind is FaultKind.SLOW:
            provider._wait(fault.delay)
        if decision is _Decision.NEW and not applied:
            stored = provider._apply_charge(key, body, body_hash)
        status, headers, answer = _answer(decision, stored)

        if fault is None or kind is FaultKind.SLOW:
            self._send(status, answer, headers)
        elif kind is FaultKind.APPLY_THEN_TIMEOUT:
            provider._wait(fault.delay)  # then the connection closes without an answer
        elif kind is FaultKind.APPLY_THEN_500:
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, _error_body("api_error", "injected"))
        else:  # reset_after_apply
            self._reset()

    def _refuse(self, fault: Fault | None) -> None:
        """A fault that answers before the key is looked at: a 429, or a reset."""
        if fault is not None and fault.kind is FaultKind.RATE_LIMITED:
            limit = [] if fault.retry_after is None else [(RETRY_AFTER_HEADER, fault.retry_after)]
            self._send(
                HTTPStatus.TOO_MANY_REQUESTS,
                _error_body("rate_limit_error", "too many requests; retry later"),
                limit,
            )
        else:
            self._reset()

    def _charge_request(self) -> tuple[str, dict[str, Any]] | None:
        """The key and the valid body of a charge request; None after answering 400."""
        key = self.headers.get(IDEMPOTENCY_HEADER)
        raw = self._read_body()
        if key is not None:
            self._provider._count_request(key)
        if not key or len(key) > MAX_KEY_LENGTH:
            self._invalid(f"an {IDEMPOTENCY_HEADER} header of 1 to {MAX_KEY_LENGTH} characters")
            return None
        try:
            body = json.loads(raw) if raw is not None else None
        except ValueError:
            self._invalid("the body is not valid JSON")
            return None
        problem = charge_error(body)
        if problem is not None:
            self._invalid(problem)
            return None
        return key, cast(dict[str, Any], body)  # charge_error checked it is an object

    def _lookup(self, key: str) -> None:
        if not key:
            self._invalid("the idempotency_key query parameter is required")
            return
        fault, record = self._provider._begin_lookup(key)
        if fault is not None:
            self._send(
                HTTPStatus.SERVICE_UNAVAILABLE, _error_body("api_error", "lookup unavailable")
            )
        elif record is None:
            self._send(HTTPStatus.NOT_FOUND, _error_body("not_found", "no charge for this key"))
        elif record.response is None:
            self._send(
                HTTPStatus.CONFLICT,
                _error_body("idempotency_error", IN_PROGRESS_MESSAGE),
            )
        else:
            self._send(HTTPStatus.OK, record.response)

    # faults

    def _arm_fault(self) -> None:
        raw = self._read_body()
        try:
            fault = Fault.from_json(json.loads(raw) if raw is not None else None)
        except ValueError as exc:
            self._invalid(str(exc))
            return
        self._provider._arm(fault)
        self._send_faults()

    def _send_faults(self) -> None:
        self._send_json(HTTPStatus.OK, [f.to_json() for f in self._provider.faults()])

    # plumbing

    def _read_body(self) -> bytes | None:
        """The request body, or None if it is missing or too large to read."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return None
        if length <= 0 or length > MAX_BODY_BYTES:
            return None
        return self.rfile.read(length)

    def _invalid(self, message: str) -> None:
        self._send(HTTPStatus.BAD_REQUEST, _error_body("invalid_request_error", message))

    def _no_route(self) -> None:
        # Not "not_found": a lookup must never mistake a wrong URL for "never applied".
        self._send(HTTPStatus.NOT_FOUND, _error_body("invalid_request_error", "no such route"))

    def _send_json(self, status: HTTPStatus, value: object) -> None:
        self._send(status, json.dumps(value).encode())

    def _send(
        self, status: HTTPStatus, body: bytes, headers: Sequence[tuple[str, str]] = ()
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _reset(self) -> None:
        """Abort the connection: SO_LINGER 0 makes close() send a RST instead of a FIN."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.rfile.close()  # the socket's file descriptor closes with its last reader
        self.close_connection = True


# -- the client -------------------------------------------------------------------------------


class ProviderError(Exception):
    """Root of the client's errors; ``status`` and ``error_type`` when the provider answered."""

    def __init__(
        self, message: str, *, status: int | None = None, error_type: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type


class ProviderAmbiguous(ProviderError):  # noqa: N818  (an outcome, not a failure of the caller)
    """The charge may or may not have happened: look the key up before doing anything else."""


class ProviderTimeout(ProviderAmbiguous):
    """No answer within the timeout; the provider may have applied the charge meanwhile."""


class ProviderConnectionError(ProviderAmbiguous):
    """The connection was refused, reset or closed before a complete answer arrived.

    A refused connection cannot have applied anything, but the lookup says so just as well,
    and one rule for the whole branch keeps callers simple.
    """


class ProviderServerError(ProviderAmbiguous):
    """A 5xx (or a 200 that cannot be read): the provider may have applied the charge first."""


class ProviderConflict(ProviderError):  # noqa: N818
    """409: the key's first request is still being processed. Nothing new applied; retry later."""


class ProviderRateLimited(ProviderError):  # noqa: N818
    """429: the provider refused the request before acting on it; nothing was applied.

    ``retry_after`` is the ``Retry-After`` header as sent (seconds or an HTTP-date), or None.
    """

    def __init__(self, message: str, *, retry_after: str | None, error_type: str | None) -> None:
        super().__init__(message, status=HTTPStatus.TOO_MANY_REQUESTS, error_type=error_type)
        self.retry_after = retry_after


class ProviderRejected(ProviderError):  # noqa: N818
    """400, 422 or another 4xx: retrying the same request cannot succeed; it applied nothing.

    A 422 ``idempotency_error`` means the key was used with a different body: the charge that
    exists under it belongs to that other body.
    """


class ProviderUnavailable(ProviderError):  # noqa: N818
    """A lookup could not tell whether the key was applied (503, 5xx, timeout, connection)."""


@dataclass(frozen=True, slots=True)
class ChargeResult:
    """A charge as the provider reports it."""

    id: str
    amount: int
    currency: str
    status: str
    idempotency_key: str
    reference: str | None = None
    #: True when the provider answered from its idempotency store (``Idempotent-Replayed``).
    replayed: bool = False

    @classmethod
    def from_json(cls, data: bytes, *, replayed: bool = False) -> ChargeResult:
        """Parse a charge body; ValueError if it is not one."""
        value = json.loads(data)
        if not isinstance(value, dict):
            raise ValueError("a charge is a JSON object")
        fields: dict[str, type | tuple[type, ...]] = {
            "id": str,
            "amount": int,
            "currency": str,
            "status": str,
            "idempotency_key": str,
            "reference": (str, type(None)),
        }
        for name, expected in fields.items():
            if not isinstance(value.get(name), expected):
                raise ValueError(f"charge field {name!r} is missing or malformed")
        return cls(
            id=value["id"],
            amount=value["amount"],
            currency=value["currency"],
            status=value["status"],
            idempotency_key=value["idempotency_key"],
            reference=value["reference"],
            replayed=replayed,
        )


def _error_of(data: bytes) -> tuple[str | None, str]:
    """The provider's ``error.type`` and ``error.message``, tolerating any body."""
    try:
        error = json.loads(data)["error"]
        return str(error["type"]), str(error.get("message", ""))
    except (ValueError, TypeError, KeyError):
        return None, data[:200].decode(errors="replace")


class PaymentClient:
    """A client of :class:`PaymentProvider` (stdlib only, one connection per call, thread-safe).

    ``timeout`` bounds the connect and each read, in seconds.
    """

    def __init__(self, base_url: str, timeout: float = 2.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError("base_url must be an http:// URL")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self.timeout = timeout

    def charge(self, key: str, body: Mapping[str, object]) -> ChargeResult:
        """Create the charge for ``key``, or get the stored one back if the key was applied."""
        headers = {IDEMPOTENCY_HEADER: key, "Content-Type": "application/json"}
        try:
            status, answer, data = self._request(
                "POST", "/v1/charges", json.dumps(dict(body)).encode(), headers
            )
        except TimeoutError as exc:
            raise ProviderTimeout("no answer within the timeout") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise ProviderConnectionError(f"connection failed: {exc!r}") from exc
        if status == HTTPStatus.OK:
            try:
                replayed = answer.get(REPLAYED_HEADER) == "true"
                return ChargeResult.from_json(data, replayed=replayed)
            except ValueError as exc:
                raise ProviderServerError("unreadable charge", status=status) from exc
        error_type, message = _error_of(data)
        if status == HTTPStatus.TOO_MANY_REQUESTS:
            retry_after = answer.get(RETRY_AFTER_HEADER)
            raise ProviderRateLimited(message, retry_after=retry_after, error_type=error_type)
        kind: type[ProviderError] = ProviderRejected
        if status == HTTPStatus.CONFLICT:
            kind = ProviderConflict
        elif status >= HTTPStatus.INTERNAL_SERVER_ERROR:
            kind = ProviderServerError
        raise kind(message, status=status, error_type=error_type)

    def lookup(self, key: str) -> ChargeResult | None:
        """The charge applied under ``key``, or None when the provider confirms there is none."""
        path = "/v1/charges?" + urlencode({"idempotency_key": key})
        try:
            status, _, data = self._request("GET", path, None, {})
        except (OSError, http.client.HTTPException) as exc:
            raise ProviderUnavailable("lookup failed: cannot tell") from exc
        if status == HTTPStatus.OK:
            try:
                return ChargeResult.from_json(data)
            except ValueError as exc:
                raise ProviderUnavailable("unreadable charge", status=status) from exc
        error_type, message = _error_of(data)
        if status == HTTPStatus.NOT_FOUND and error_type == "not_found":
            return None
        kind: type[ProviderError] = ProviderRejected
        if status == HTTPStatus.CONFLICT:
            kind = ProviderConflict
        elif status >= HTTPStatus.INTERNAL_SERVER_ERROR:
            kind = ProviderUnavailable
        raise kind(message, status=status, error_type=error_type)

    def _request(
        self, method: str, path: str, body: bytes | None, headers: Mapping[str, str]
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        """Status, headers and body of one request on a new connection."""
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        try:
            conn.request(method, self._prefix + path, body=body, headers=dict(headers))
            response = conn.getresponse()
            data = response.read()
            return response.status, response.headers, data
        finally:
            conn.close()


# -- as a process -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM or SIGINT; print the URL on stdout once listening."""
    parser = argparse.ArgumentParser(
        prog="python -m bridge.demo.provider",
        description="A local payment provider with idempotency keys and switchable faults.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (default: any free one)")
    args = parser.parse_args(argv)

    # Blocked before any thread starts, so every thread inherits the mask and only sigwait
    # below receives the signal: no handler runs in the middle of a request.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    provider = PaymentProvider(args.host, args.port)
    try:
        provider.start()
    except OSError as exc:
        print(f"cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        print(provider.url, flush=True)
        signal.sigwait(stop_signals)
    finally:
        provider.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
