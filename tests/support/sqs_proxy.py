"""An HTTP proxy in front of moto's SQS server: real-AWS receipt-handle rules, and faults.

moto accepts any receipt handle a message ever had: a delete with a replaced handle deletes the
message, and an extension with one (or of a message no longer in flight) succeeds and hides the
message again. SQS does neither, and a consumer that is only right against moto is wrong in
production. The proxy tracks every message from the traffic it forwards and answers as SQS does:

* each receive of a message issues a new receipt handle and replaces the old one;
* ``DeleteMessage(Batch)`` with a replaced handle succeeds and deletes nothing (it never reaches
  moto);
* ``ChangeMessageVisibility(Batch)`` with a replaced handle fails with
  ``ReceiptHandleIsInvalid``; with the current handle after the message's visibility deadline
  (no longer in flight) with ``MessageNotInflight``.

A received message's deadline is counted from the moment the broker's answer came back (SQS
starts the visibility timeout when it returns a message); an extension's from the moment the
proxy sent it on (the broker applies it at once, whenever its answer arrives).

Faults, on demand (:meth:`SqsProxy.inject`) or on a share of calls (:meth:`SqsProxy.set_faults`):
``error`` (a 500 ``InternalError``, the call never reaches moto), ``throttle`` (a 400
``ThrottlingException`` or ``RequestThrottled``, never reaches moto), ``latency`` (the call waits
before it is forwarded) and ``reset`` (the call is forwarded and applied, then the client's
connection is reset before it hears the answer). boto3 speaks SQS's JSON protocol
(``X-Amz-Target: AmazonSQS.<Action>``, JSON bodies), which is what the proxy reads and writes.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import struct
import threading
import time
import urllib.parse
import uuid
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: SO_LINGER on with a zero timeout: close() resets the connection instead of a graceful FIN.
_ABORT = struct.pack("ii", 1, 0)
_JSON = "application/x-amz-json-1.0"

RECEIVE = "ReceiveMessage"
DELETE = "DeleteMessage"
DELETE_BATCH = "DeleteMessageBatch"
CHANGE = "ChangeMessageVisibility"
CHANGE_BATCH = "ChangeMessageVisibilityBatch"
#: the calls a consumer makes, which are the ones faults apply to unless told otherwise
CONSUMER_CALLS = frozenset({RECEIVE, DELETE, DELETE_BATCH, CHANGE, CHANGE_BATCH})

INVALID_HANDLE = "ReceiptHandleIsInvalid"
NOT_IN_FLIGHT = "MessageNotInflight"
#: the query-compatible code SQS puts in ``x-amzn-query-error``; botocore reports this one
NOT_IN_FLIGHT_QUERY = "AWS.SimpleQueueService.MessageNotInflight"


class Fault(Enum):
    ERROR = "error"
    THROTTLE = "throttle"
    LATENCY = "latency"
    RESET = "reset"


ALL_FAULTS = tuple(Fault)


@dataclass(slots=True)
class _Message:
    """What the proxy knows of one message it saw received."""

    queue: str
    message_id: str
    handle: str
    #: monotonic time its visibility ends
    deadline: float
    receives: int = 1
    deleted: bool = False
    #: extensions forwarded within its deadline whose answer has not come back yet: SQS would
    #: have applied them on arrival, moto applies them when it gets to them
    extending: int = 0
    #: its string message attributes, as the receive returned them
    attributes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Rates:
    rate: float
    kinds: tuple[Fault, ...]
    actions: frozenset[str]


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else {}


class SqsProxy:
    """The proxy, serving on :attr:`url` until :meth:`close`; thread-safe."""

    def __init__(self, upstream: str, *, seed: int = 0, latency_seconds: float = 2.0) -> None:
        parts = urllib.parse.urlsplit(upstream)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"the upstream needs a host and a port: {upstream!r}")
        self._upstream = (parts.hostname, parts.port)
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self.latency_seconds = latency_seconds
        self._messages: dict[tuple[str, str], _Message] = {}
        #: every handle ever issued -> its message (replaced handles included)
        self._handles: dict[str, _Message] = {}
        self._default_visibility: dict[str, int] = {}
        self._on_demand: dict[str, deque[Fault]] = {}
        self._rates: _Rates | None = None
        self._local = threading.local()
        #: what happened: ``forwarded.<Action>``, ``fault.<kind>.<Action>``, ``stale_delete``,
        #: ``refused.<code>``, ``released`` (messages made visible at once by visibility 0),
        #: ``redelivered_in_flight`` (received again before its deadline as the proxy counts it:
        #: moto starts the clock when it picks a message, not when its late answer arrives, and
        #: applies an extension forwarded in time only when it gets to it),
        #: ``unheard_received`` (messages moto handed out in a receive whose answer a reset
        #: kept from the client: each comes back after its visibility timeout),
        #: ``proxy_error`` (a bug here: tests assert there is none)
        self.counts: Counter[str] = Counter()
        #: seconds moto took to answer each forwarded call, by action (for diagnostics)
        self.timings: dict[str, list[float]] = {}
        #: how long after its deadline each refused extension came (for diagnostics)
        self.late: list[float] = []
        #: (monotonic time, queue, messages) of every receive moto answered
        self.answered: list[tuple[float, str, int]] = []
        self._receiving = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                proxy._serve(self, body)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="sqs-proxy", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- faults -----------------------------------------------------------------------------------

    def inject(self, fault: Fault, action: str, times: int = 1) -> None:
        """The next ``times`` calls of ``action`` get ``fault``."""
        with self._lock:
            self._on_demand.setdefault(action, deque()).extend([fault] * times)

    def set_faults(
        self,
        rate: float,
        kinds: Sequence[Fault] = ALL_FAULTS,
        actions: frozenset[str] = CONSUMER_CALLS,
    ) -> None:
        """A share ``rate`` of the calls of ``actions`` gets one of ``kinds``, drawn evenly."""
        if not 0 <= rate <= 1:
            raise ValueError(f"a fault rate is a share from 0 to 1, not {rate}")
        with self._lock:
            self._rates = _Rates(rate, tuple(kinds), actions) if rate and kinds else None

    def clear_faults(self) -> None:
        with self._lock:
            self._rates = None
            self._on_demand.clear()

    def faults(self) -> int:
        """How many faults were injected so far."""
        with self._lock:
            return sum(n for name, n in self.counts.items() if name.startswith("fault."))

    def _draw(self, action: str) -> Fault | None:
        with self._lock:
            waiting = self._on_demand.get(action)
            if waiting:
                fault = waiting.popleft()
            elif (
                self._rates is not None
                and action in self._rates.actions
                and self._random.random() < self._rates.rate
            ):
                fault = self._random.choice(self._rates.kinds)
            else:
                return None
            self.counts[f"fault.{fault.value}.{action}"] += 1
            return fault

    # -- what the proxy saw -----------------------------------------------------------------------

    def receives(self, queue_url: str) -> Counter[str]:
        """How many times each message of the queue was received (message id -> receives)."""
        with self._lock:
            return Counter(
                {m.message_id: m.receives for m in self._messages.values() if m.queue == queue_url}
            )

    def attributes(self, queue_url: str) -> dict[str, dict[str, str]]:
        """The string attributes of each message received from the queue, by message id."""
        with self._lock:
            return {
                m.message_id: dict(m.attributes)
                for m in self._messages.values()
                if m.queue == queue_url
            }

    def in_flight(self, queue_url: str) -> int:
        """Messages received and neither deleted nor past their visibility deadline."""
        now = time.monotonic()
        with self._lock:
            return sum(
                1
                for m in self._messages.values()
                if m.queue == queue_url and not m.deleted and m.deadline > now
            )

    def deleted(self, queue_url: str) -> int:
        with self._lock:
            return sum(1 for m in self._messages.values() if m.queue == queue_url and m.deleted)

    # -- serving ----------------------------------------------------------------------------------

    @property
    def receiving(self) -> int:
        """Receives the proxy holds now: not yet answered, or still waiting to be forwarded."""
        with self._lock:
            return self._receiving

    def _serve(self, request: BaseHTTPRequestHandler, body: bytes) -> None:
        target = request.headers.get("X-Amz-Target", "")
        action = target.rpartition(".")[2]
        if action != RECEIVE:
            self._handle(request, action, body)
            return
        with self._lock:
            self._receiving += 1
        try:
            self._handle(request, action, body)
        finally:
            with self._lock:
                self._receiving -= 1

    def _handle(self, request: BaseHTTPRequestHandler, action: str, body: bytes) -> None:
        fault = self._draw(action) if action else None
        if fault is Fault.ERROR:
            self._reply(request, _error(500, "InternalError", "Receiver", "injected"))
            return
        if fault is Fault.THROTTLE:
            code = self._random.choice(("ThrottlingException", "RequestThrottled"))
            self._reply(request, _error(400, code, "Sender", "Rate exceeded"))
            return
        if fault is Fault.LATENCY:
            time.sleep(self.latency_seconds)
        try:
            answer = self._apply(request, action, body)
        except (OSError, http.client.HTTPException):
            self._reset(request)  # moto unreachable: the client sees the connection fail
            return
        except Exception as exc:  # noqa: BLE001  (a proxy bug must fail the test, not hang it)
            with self._lock:
                self.counts["proxy_error"] += 1
            self._reply(request, _error(500, "InternalError", "Receiver", type(exc).__name__))
            return
        if fault is Fault.RESET:
            if action == RECEIVE and answer.status == 200:
                unheard = len(answer.json().get("Messages", []))
                with self._lock:
                    self.counts["unheard_received"] += unheard
            self._reset(request)  # applied by moto; the client never hears it
            return
        self._reply(request, answer)

    def _apply(self, request: BaseHTTPRequestHandler, action: str, body: bytes) -> _Answer:
        """Forward the call, or the part of it SQS's rules let through; track what it did."""
        try:
            params = json.loads(body) if body else {}
        except ValueError:
            params = {}
        if not isinstance(params, dict):
            params = {}
        queue = str(params.get("QueueUrl", ""))
        if action == RECEIVE:
            return self._receive(request, queue, params, body)
        if action in (DELETE, CHANGE):
            entry = {"Id": "0", **params}
            verdict = self._judge(action, queue, entry)
            if verdict is not None:
                code, text = verdict
                query = NOT_IN_FLIGHT_QUERY if code == NOT_IN_FLIGHT else code
                if action == DELETE:
                    return _ok({})
                return _error(400, code, "Sender", text, query_code=query)
            sent = time.monotonic()
            answer = self._forward(request, body)
            if answer.status == 200:
                self._applied(action, queue, [entry], sent)
            return answer
        if action in (DELETE_BATCH, CHANGE_BATCH):
            return self._batch(request, action, queue, params)
        return self._forward(request, body)

    def _receive(
        self, request: BaseHTTPRequestHandler, queue: str, params: dict[str, Any], body: bytes
    ) -> _Answer:
        visibility = params.get("VisibilityTimeout")
        if visibility is None:
            visibility = self._queue_visibility(request, queue)
        answer = self._forward(request, body)
        if answer.status != 200:
            return answer
        # SQS starts a message's visibility timeout when it returns the message.
        now = time.monotonic()
        deadline = now + int(visibility)
        found = answer.json().get("Messages", [])
        with self._lock:
            self.counts[f"forwarded.{RECEIVE}"] += 1
            self.answered.append((now, queue, len(found)))
            for m in found:
                key = (queue, m["MessageId"])
                known = self._messages.get(key)
                if known is None:
                    attributes = {
                        name: str(value.get("StringValue"))
                        for name, value in m.get("MessageAttributes", {}).items()
                        if isinstance(value, dict)
                    }
                    known = _Message(
                        queue, m["MessageId"], m["ReceiptHandle"], deadline, attributes=attributes
                    )
                    self._messages[key] = known
                else:
                    # Redelivered while the proxy still counted it in flight: moto's clock,
                    # started when it picked the message, ran out before the answer's.
                    if not known.deleted and (known.deadline > now or known.extending):
                        self.counts["redelivered_in_flight"] += 1
                    known.handle = m["ReceiptHandle"]
                    known.deadline = deadline
                    known.receives += 1
                self._handles[m["ReceiptHandle"]] = known
        return answer

    def _judge(self, action: str, queue: str, entry: dict[str, Any]) -> tuple[str, str] | None:
        """Why SQS would not let this entry through to moto, or None to forward it."""
        handle = str(entry.get("ReceiptHandle", ""))
        now = time.monotonic()
        with self._lock:
            known = self._handles.get(handle)
            if known is None or known.deleted or known.queue != queue:
                return None  # never seen or already gone: moto's own answer is SQS's
            if known.handle != handle:
                if action in (DELETE, DELETE_BATCH):
                    self.counts["stale_delete"] += 1
                    return ("", "")  # succeeds, deletes nothing
                self.counts[f"refused.{INVALID_HANDLE}"] += 1
                return (
                    INVALID_HANDLE,
                    f'The input receipt handle "{handle[:12]}..." is not a valid receipt handle.',
                )
            if action in (CHANGE, CHANGE_BATCH) and now >= known.deadline:
                self.counts[f"refused.{NOT_IN_FLIGHT}"] += 1
                self.late.append(now - known.deadline)
                return (NOT_IN_FLIGHT, "Message is not in flight.")
        return None

    def _batch(
        self, request: BaseHTTPRequestHandler, action: str, queue: str, params: dict[str, Any]
    ) -> _Answer:
        entries = [e for e in params.get("Entries", []) if isinstance(e, dict)]
        passed: list[dict[str, Any]] = []
        successful: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        for entry in entries:
            verdict = self._judge(action, queue, entry)
            if verdict is None:
                passed.append(entry)
            elif verdict[0] == "":
                successful.append({"Id": entry["Id"]})
            else:
                code, text = verdict
                failed.append(
                    {"Id": entry["Id"], "SenderFault": True, "Code": code, "Message": text}
                )
        if passed:
            sent = time.monotonic()
            extending = self._extending(action, passed, +1)
            body = json.dumps({**params, "Entries": passed}).encode()
            try:
                answer = self._forward(request, body)
            finally:
                self._extending(action, extending, -1)
            if answer.status != 200:
                return answer  # the whole call failed: as SQS would report it
            found = answer.json()
            done = {e["Id"] for e in found.get("Successful", [])}
            self._applied(action, queue, [e for e in passed if e["Id"] in done], sent)
            successful += found.get("Successful", [])
            failed += found.get("Failed", [])
        elif entries:
            with self._lock:
                self.counts[f"answered.{action}"] += 1
        return _ok({"Successful": successful, "Failed": failed})

    def _extending(
        self, action: str, entries: list[dict[str, Any]], step: int
    ) -> list[dict[str, Any]]:
        """Count the extensions among ``entries`` as forwarded (+1) or answered (-1)."""
        if action not in (CHANGE, CHANGE_BATCH):
            return []
        with self._lock:
            for entry in entries:
                known = self._handles.get(str(entry.get("ReceiptHandle", "")))
                if known is not None:
                    known.extending += step
        return entries

    def _applied(
        self, action: str, queue: str, entries: Sequence[dict[str, Any]], sent: float
    ) -> None:
        """moto applied these entries: a delete removes the message, a change moves its deadline."""
        with self._lock:
            self.counts[f"forwarded.{action}"] += 1
            for entry in entries:
                known = self._handles.get(str(entry.get("ReceiptHandle", "")))
                if known is None or known.queue != queue:
                    continue
                if action in (DELETE, DELETE_BATCH):
                    known.deleted = True
                    continue
                if known.handle != entry.get("ReceiptHandle"):
                    continue  # received again meanwhile: the new copy's deadline stands
                seconds = int(entry.get("VisibilityTimeout", 0))
                known.deadline = sent + seconds
                if seconds == 0:
                    self.counts["released"] += 1

    def _queue_visibility(self, request: BaseHTTPRequestHandler, queue: str) -> int:
        """The queue's own visibility timeout, for a receive that does not name one."""
        with self._lock:
            known = self._default_visibility.get(queue)
        if known is not None:
            return known
        body = json.dumps({"QueueUrl": queue, "AttributeNames": ["VisibilityTimeout"]}).encode()
        answer = self._forward(request, body, action="GetQueueAttributes")
        seconds = int(answer.json().get("Attributes", {}).get("VisibilityTimeout", 30))
        with self._lock:
            self._default_visibility[queue] = seconds
        return seconds

    def _forward(
        self, request: BaseHTTPRequestHandler, body: bytes, *, action: str | None = None
    ) -> _Answer:
        """One call to moto on this thread's kept-alive connection (one reconnect on failure).

        The client's headers go along (moto checks no signature); ``action`` replaces its target.
        """
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in ("connection", "content-length", "host", "keep-alive")
        }
        headers["Content-Length"] = str(len(body))
        if action is not None:
            headers["X-Amz-Target"] = f"AmazonSQS.{action}"
        started = time.monotonic()
        for attempt in range(2):
            conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
            if conn is None:
                conn = http.client.HTTPConnection(*self._upstream, timeout=60)
                self._local.conn = conn
            try:
                conn.request("POST", request.path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
                continue
            with self._lock:
                name = action or headers.get("X-Amz-Target", "").rpartition(".")[2]
                self.timings.setdefault(name, []).append(time.monotonic() - started)
            kept = [
                (k, v)
                for k, v in response.getheaders()
                if k.lower() not in ("content-length", "connection", "transfer-encoding", "date")
            ]
            return _Answer(response.status, kept, data)
        raise AssertionError("unreachable")

    def _reply(self, request: BaseHTTPRequestHandler, answer: _Answer) -> None:
        try:
            request.send_response(answer.status)
            for name, value in answer.headers:
                request.send_header(name, value)
            request.send_header("Content-Length", str(len(answer.body)))
            request.end_headers()
            request.wfile.write(answer.body)
        except OSError:  # the client went away (a bridge stopped mid-call): nothing to answer
            request.close_connection = True

    def _reset(self, request: BaseHTTPRequestHandler) -> None:
        request.close_connection = True
        try:
            request.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _ABORT)
            request.connection.close()
        except OSError:
            pass


def _headers(**extra: str) -> list[tuple[str, str]]:
    return [("Content-Type", _JSON), ("x-amzn-RequestId", str(uuid.uuid4())), *extra.items()]


def _ok(body: dict[str, Any]) -> _Answer:
    return _Answer(200, _headers(), json.dumps(body).encode())


def _error(
    status: int, code: str, fault: str, text: str, *, query_code: str | None = None
) -> _Answer:
    """An error as SQS's JSON protocol sends it, with the query-compatible code header."""
    body = {"__type": f"com.amazonaws.sqs#{code}", "message": text}
    headers = _headers(**{"x-amzn-query-error": f"{query_code or code};{fault}"})
    return _Answer(status, headers, json.dumps(body).encode())


@contextmanager
def sqs_proxy(upstream: str, **settings: Any) -> Iterator[SqsProxy]:
    proxy = SqsProxy(upstream, **settings)
    try:
        yield proxy
    finally:
        proxy.close()
