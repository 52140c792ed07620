"""The console's HTTP server: the ASGI app of :mod:`.web` served by uvicorn on one port.

uvicorn parses the requests (a malformed one is answered 400 with a status line), bounds a
request's head (:data:`HEAD_MAX`), closes a kept-alive connection idle for
:data:`KEEP_ALIVE_SECONDS`, and answers 503 past :data:`CONNECTIONS_MAX` open connections.
One limit it lacks is added here (:class:`ConsoleProtocol`): a connection that has not sent a
whole request head within :data:`HEAD_SECONDS` of opening, or of its previous answer, is
closed, so idle or slow connections cannot hold the console's connection slots.

The socket is bound when the server is made (a taken port fails at once, IPv6 addresses such
as ``::1`` work); a console bound to every address (``0.0.0.0``, ``::``) says so in a warning,
since its pages are then reachable from any network the machine is on. Behind no proxy, the
``Host`` header must name this console (``FENCEBRIDGE_CONSOLE_ALLOWED_HOSTS`` adds names), so
a page of another site cannot reach it through DNS rebinding.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import threading

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from bridge.console.api import ConsoleApi
from bridge.console.auth import LOOPBACK_HOSTS, ProxyAuth, Tokens
from bridge.console.pages import ConsolePages
from bridge.console.sessions import Sessions
from bridge.console.throttle import Throttle
from bridge.console.web import PAGE_HEADERS, SECURITY_HEADERS, create_app
from bridge.errors import ConfigError
from bridge.service import Deadline

log = logging.getLogger(__name__)

__all__ = ["PAGE_HEADERS", "SECURITY_HEADERS", "ConsoleServer"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8091
ALLOWED_HOSTS_ENV = "FENCEBRIDGE_CONSOLE_ALLOWED_HOSTS"
KEEP_ALIVE_SECONDS = 5
HEAD_SECONDS = 10.0
CONNECTIONS_MAX = 1000
HEAD_MAX = 16 * 1024
WILDCARDS = ("0.0.0.0", "::", "")  # noqa: S104  (the addresses a warning is about)
#: a console bound here is reached over plain HTTP on the machine itself: no Secure cookies
LOOPBACK = LOOPBACK_HOSTS


class ConsoleProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection that sends no whole request head in
    time (``head_seconds``, set on the subclass :func:`_protocol` makes)."""

    head_seconds = HEAD_SECONDS
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.head_seconds, self._too_slow)

    def _too_slow(self) -> None:
        self._head_timer = None
        busy = self.cycle is not None and not self.cycle.response_complete
        if not busy and not self.transport.is_closing():
            self.transport.close()


def _protocol(head_seconds: float) -> type[ConsoleProtocol]:
    return type("ConsoleProtocolTimed", (ConsoleProtocol,), {"head_seconds": head_seconds})


def allowed_hosts(host: str, environ: dict[str, str] | None = None) -> list[str]:
    """The names a request's ``Host`` may give: the bound address, loopback's names when bound
    there, and what ``$ALLOWED_HOSTS_ENV`` lists; any for a wildcard bind without a list."""
    env = os.environ if environ is None else environ
    listed = [h.strip().lower() for h in env.get(ALLOWED_HOSTS_ENV, "").split(",") if h.strip()]
    if host in WILDCARDS:
        return listed or ["*"]
    names = [host.lower(), *listed]
    if host in LOOPBACK:
        names += ["127.0.0.1", "localhost", "::1", "[::1]"]
    return sorted(set(names))


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host`` (IPv4 or IPv6) and ``port`` (0: any free one)."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"the console cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


class ConsoleServer:
    def __init__(
        self,
        api: ConsoleApi,
        tokens: Tokens,
        host: str,
        port: int,
        *,
        sessions: Sessions | None = None,
        proxy: ProxyAuth | None = None,
        throttle: Throttle | None = None,
        head_seconds: float = HEAD_SECONDS,
        environ: dict[str, str] | None = None,
    ) -> None:
        if host in WILDCARDS:
            log.warning(
                "the console is bound to every address (%s): its pages are reachable from any "
                "network this machine is on; bind to 127.0.0.1 behind a proxy, or set $%s",
                host or "*",
                ALLOWED_HOSTS_ENV,
            )
        throttle = throttle or Throttle()
        pages = ConsolePages(
            api,
            tokens,
            sessions or Sessions(),
            secure_cookies=host not in LOOPBACK,
            throttle=throttle,
        )
        app = create_app(
            api,
            pages,
            tokens,
            proxy=proxy,
            allowed_hosts=allowed_hosts(host, environ),
            throttle=throttle,
        )
        self._socket = bind(host, port)
        config = uvicorn.Config(
            app,
            http=_protocol(head_seconds),
            ws="none",
            lifespan="off",
            access_log=False,
            log_config=None,
            server_header=False,
            proxy_headers=False,
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
            limit_concurrency=CONNECTIONS_MAX,
            h11_max_incomplete_event_size=HEAD_MAX,
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    def start(self, deadline: float | Deadline = 10.0) -> None:
        """Serve on a thread of its own; returns once the server listens."""
        self._thread = threading.Thread(target=self._serve, name="console", daemon=True)
        self._thread.start()
        until = Deadline.of(deadline)
        while not self._server.started:
            if self._failed is not None or not self._thread.is_alive():
                raise RuntimeError("the console server did not start") from self._failed
            if until.expired:
                raise RuntimeError("the console server did not start in time")
            threading.Event().wait(0.01)

    def _serve(self) -> None:
        try:
            self._server.run(sockets=[self._socket])
        except BaseException as exc:  # noqa: BLE001  (said in the log, and to start())
            self._failed = exc
            log.error("the console server stopped: %s", type(exc).__name__)

    def stop(self, deadline: float | Deadline = 5.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            until = Deadline.of(deadline)
            self._thread.join(max(until.remaining(), 0.1))
        self._socket.close()


def describe(host: str, port: int) -> str:
    """The console's base URL (an IPv6 address in brackets)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"
