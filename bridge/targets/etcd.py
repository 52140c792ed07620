"""Class B on etcd: the fence lives in a companion key, compared and written in one transaction.

Each guarded key ``K`` has a fence key ``F`` (:func:`fence_key`: :data:`FENCE_PREFIX` + ``K``)
that holds ``<fence as 20 digits> <claim stamp>``. :func:`fenced_put` sends one ``Txn``, which
etcd evaluates atomically, so a stale worker's write is refused by etcd itself::

    if   create_revision(F) == 0        no fenced write yet          -> put F, put K
    elif value(F) <  "<fence>"          the stored fence is lower    -> put F, put K
    elif value(F) == "<fence> <stamp>"  this claim wrote it before   -> put F, put K
    else                                a newer (or another) claim   -> nothing: FencedOut

Why this shape: etcd ANDs the compares of one ``Txn`` (no OR), and a ``VALUE`` compare on a
missing key always fails, so "no fence yet" is a create-revision compare and the other cases are
nested transactions in the failure branch (etcd 3.3 or later): still one request, one revision.
The fence is zero-padded, so etcd's byte order on values is the fences' numeric order. Equal
fences: only the same claim may repeat its write (as ``last_fence <= :fence`` lets it for
PostgreSQL and DynamoDB); its stamp is the operation's opaque, tenant-scoped key
(``ctx.idempotency_key``, no raw identifier), so an equal fence from any other writer is refused.
Keep ``F`` as long as ``K``: deleting it lets any fence write again.

Outcomes, as :mod:`bridge.executors.conditional_write` expects them:

* refused compare: :class:`~bridge.errors.FencedOut` (never retried);
* the connection could not be opened: :class:`~bridge.handlers.RetryLater` (nothing was sent);
* etcd refused the request as malformed or forbidden (HTTP 400, 403, 404, 413):
  :class:`~bridge.handlers.TerminalFailure`; unauthenticated or resource-exhausted (401, 429;
  429 is also the gateway's answer to a request over its size limit, which the attempts then
  exhaust): :class:`~bridge.handlers.RetryLater` (all are refused before anything is applied);
* anything else once the request may have left (a timeout, a reset, a 5xx such as the 504 of a
  proposal that timed out and may still apply, an answer that cannot be read):
  :class:`~bridge.handlers.Ambiguous`. The executor retries it under the next fence, whose write
  supersedes whatever this one did, or parks it ``unknown`` on the last attempt. Never repeat an
  ambiguous write yourself.

The client is etcd's v3 JSON gateway (``POST /v3/kv/txn``, base64 keys and values; etcd 3.4 or
later) over :mod:`http.client`, one connection per request. Why no client library: ``etcd3`` is
unmaintained and fails to import with current protobuf; ``etcd3gw`` passes the ``Txn`` body
through as JSON anyway and reports a refused connection and a reset after sending as one
exception, the very distinction above; the maintained gRPC clients are asyncio-only, while class B
handlers are synchronous. A fresh connection per request also keeps a stale keep-alive socket
from turning a write that never left into an ambiguous one.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from bridge.errors import FencedOut
from bridge.handlers import Ambiguous, Context, RetryLater, TerminalFailure

#: where the fence keys live, apart from the guarded keys (a prefix range on ``K`` never sees them)
FENCE_PREFIX = b"fencebridge/last_fence/"
#: wide enough for any int64 fence: equal widths make byte order the numeric order
_FENCE_DIGITS = 20
_REJECTED = frozenset({400, 403, 404, 413})  # the request itself is wrong: retrying won't help
_NOT_APPLIED = frozenset({401, 429})  # refused before applying; a later attempt may pass


class EtcdRequestError(Exception):
    """The gateway answered with an HTTP error: its mapping of etcd's gRPC status."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(f"etcd answered {status}: {message}")


class RequestNotSent(OSError):  # noqa: N818  (a condition: nothing left this process)
    """The connection to etcd could not be opened: the request never left."""


@dataclass(frozen=True)
class EtcdClient:
    """etcd's v3 JSON gateway at ``url`` (``http://host:2379`` or ``https://…``).

    ``headers`` go with every request (an ``Authorization`` token when etcd has auth on);
    ``timeout`` bounds the connect and every read, so no write waits forever.
    """

    url: str
    timeout: float = 5.0
    ssl_context: ssl.SSLContext | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A bad url fails where the handler is built (and in `check`), never as a write outcome.
        parts = urlsplit(self.url)
        if parts.hostname is None or parts.scheme not in ("http", "https"):
            raise ValueError("the etcd url must be http://host:port or https://host:port")

    def txn(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Send one ``Txn``; see the module docstring for what each failure means."""
        return self._post("/v3/kv/txn", request)

    def get(self, key: bytes | str) -> bytes | None:
        """The key's value (a linearizable read), or ``None`` when it does not exist."""
        answer = self._post("/v3/kv/range", {"key": _b64(_bytes(key))})
        kvs = answer.get("kvs") or []
        return base64.b64decode(kvs[0].get("value", "")) if kvs else None

    def _post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        conn = self._connection()
        try:
            try:
                conn.connect()
            except OSError as exc:
                raise RequestNotSent(f"cannot connect to etcd: {type(exc).__name__}") from exc
            headers = {"Content-Type": "application/json", **self.headers}
            conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        if response.status != http.HTTPStatus.OK:
            raise EtcdRequestError(response.status, _error_message(data))
        answer = json.loads(data)
        if not isinstance(answer, dict):
            raise ValueError("etcd's answer is not a JSON object")
        return answer

    def _connection(self) -> http.client.HTTPConnection:
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        if parts.scheme == "https":
            return http.client.HTTPSConnection(
                host, parts.port or 2379, timeout=self.timeout, context=self.ssl_context
            )
        return http.client.HTTPConnection(host, parts.port or 2379, timeout=self.timeout)


def fence_key(key: bytes | str) -> bytes:
    """The companion key that holds the last fence written to ``key``."""
    return FENCE_PREFIX + _bytes(key)


def stored_fence(client: EtcdClient, key: bytes | str) -> int | None:
    """The fence of the last write accepted on ``key``, or ``None`` if none was fenced."""
    stamp = client.get(fence_key(key))
    return None if stamp is None else int(stamp[:_FENCE_DIGITS])


def fenced_put(client: EtcdClient, key: bytes | str, value: bytes | str, ctx: Context) -> int:
    """Put ``value`` at ``key`` unless a higher fence (or another claim's equal one) wrote it.

    Returns the etcd revision of the write. Sets, never adds: a takeover may repeat it.
    """
    if not ctx.idempotency_key:
        raise ValueError("a fenced etcd write needs the claim's context (Context.for_claim)")
    fkey = _b64(fence_key(key))
    stamp = _b64(_padded(ctx.fence) + b" " + ctx.idempotency_key.encode())
    puts = [
        {"request_put": {"key": fkey, "value": stamp}},
        {"request_put": {"key": _b64(_bytes(key)), "value": _b64(_bytes(value))}},
    ]
    guards = [
        {"key": fkey, "target": "CREATE", "result": "EQUAL", "create_revision": "0"},
        {"key": fkey, "target": "VALUE", "result": "LESS", "value": _b64(_padded(ctx.fence))},
        {"key": fkey, "target": "VALUE", "result": "EQUAL", "value": stamp},
    ]
    request: dict[str, Any] = {}
    for guard in reversed(guards):
        failure = [{"request_txn": request}] if request else []
        request = {"compare": [guard], "success": puts, "failure": failure}
    answer = _send(client, request)
    try:
        applied = _applied(answer, depth=len(guards))
        revision = int(answer["header"]["revision"])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise Ambiguous("etcd_unreadable_answer", type(exc).__name__) from exc
    if not applied:
        raise FencedOut(ctx.tenant_id, ctx.operation_id, ctx.fence, "etcd put")
    return revision


def _send(client: EtcdClient, request: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return client.txn(request)
    except RequestNotSent as exc:
        raise RetryLater("etcd_unreachable", str(exc)) from exc
    except EtcdRequestError as exc:
        if exc.status in _REJECTED:
            raise TerminalFailure("etcd_rejected", str(exc)) from exc
        if exc.status in _NOT_APPLIED:
            raise RetryLater("etcd_refused", str(exc)) from exc
        raise Ambiguous("etcd_ambiguous", str(exc)) from exc
    except Exception as exc:
        # The request may have reached etcd and been applied: only the next fence can tell.
        raise Ambiguous("etcd_ambiguous", type(exc).__name__) from exc


def _applied(answer: Mapping[str, Any], depth: int) -> bool:
    """Whether one of the nested branches put the keys (JSON omits a false ``succeeded``)."""
    level = answer
    for _ in range(depth - 1):
        if level.get("succeeded", False):
            return True
        level = level["responses"][0]["response_txn"]
    return bool(level.get("succeeded", False))


def _padded(fence: int) -> bytes:
    if not 0 < fence < 10**_FENCE_DIGITS:
        raise ValueError("a fence is a positive integer of at most 20 digits")
    return str(fence).zfill(_FENCE_DIGITS).encode()


def _bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _error_message(data: bytes) -> str:
    """etcd's own error text (it names no key or value), cut short."""
    try:
        parsed = json.loads(data)
    except ValueError:
        return "unreadable error body"
    message = parsed.get("message") or parsed.get("error") if isinstance(parsed, dict) else None
    return str(message)[:200] if message else "no message"
