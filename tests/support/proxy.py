"""A TCP proxy whose connectivity a test can cut and restore.

Put it between a client and PostgreSQL, point the client at :attr:`Proxy.port`, and the test
decides when the network fails: :meth:`Proxy.stop` closes the listener and cuts every open
connection abruptly (the client sees the server vanish mid-conversation; the server sees its
client go away), :meth:`Proxy.start` listens again on the same port. :meth:`Proxy.hang` is the
other kind of failure, a silent one: every connection stays open and nothing is forwarded
either way, as when a route drops packets (no RST, no FIN; each side sees only silence, and new
connections get as far as the proxy and no further); :meth:`Proxy.heal` lets the held bytes
through and forwarding resumes. :attr:`Proxy.latency` delays every chunk forwarded. Plain sockets
and threads, so it runs wherever the tests run.
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType

_CHUNK = 65536
#: SO_LINGER on with a zero timeout: close() resets the connection instead of a graceful FIN.
_ABORT = struct.pack("ii", 1, 0)
_JOIN_SECONDS = 10.0


class _Pair:
    """One proxied connection: the client's socket and the socket to the target."""

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.server: socket.socket | None = None
        self._lock = threading.Lock()
        self._cut = False
        self._pumps_left = 2

    def attach(self, server: socket.socket) -> bool:
        """Adopt the target socket; False when the pair was cut while it was connecting."""
        with self._lock:
            if self._cut:
                return False
            self.server = server
            return True

    def cut(self) -> None:
        """Sever both sides now; the pumps wake up, see the shutdown and close the sockets."""
        with self._lock:
            self._cut = True
            sockets = [s for s in (self.client, self.server) if s is not None]
        for sock in sockets:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _ABORT)
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the peer or by a pump

    @property
    def is_cut(self) -> bool:
        return self._cut

    def pump_done(self) -> bool:
        """Count a finished direction; True for the last one, which then owns closing."""
        with self._lock:
            self._pumps_left -= 1
            return self._pumps_left == 0

    def close(self) -> None:
        for sock in (self.client, self.server):
            if sock is not None:
                sock.close()


class Proxy:
    """Forwards ``host:port`` (a free port unless given) to ``target_host:target_port``."""

    def __init__(
        self, target_host: str, target_port: int, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.target = (target_host, target_port)
        self.host = host
        self.port = port
        self._lock = threading.Lock()
        self._pairs: set[_Pair] = set()
        self._threads: set[threading.Thread] = set()
        self._listener: socket.socket | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._acceptor: threading.Thread | None = None
        #: seconds each forwarded chunk is held before it is passed on (added latency)
        self.latency = 0.0
        self._flowing = threading.Condition()
        self._hung = False

    @property
    def hung(self) -> bool:
        return self._hung

    def hang(self) -> None:
        """Stop forwarding in both directions without closing anything (a silent partition).

        Bytes already read are held, further ones stay in the kernel's buffers until those
        fill; neither side is told. Connections accepted meanwhile reach the proxy only.
        """
        with self._flowing:
            self._hung = True

    def heal(self) -> None:
        """Forward again: the held bytes go first, in order."""
        with self._flowing:
            self._hung = False
            self._flowing.notify_all()

    def _wait_flowing(self, pair: _Pair) -> bool:
        """Block while the proxy hangs; False when the pair was cut meanwhile."""
        with self._flowing:
            while self._hung and not pair.is_cut:
                self._flowing.wait(0.1)
        return not pair.is_cut

    @property
    def running(self) -> bool:
        return self._listener is not None

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def start(self) -> None:
        """Listen (again, on the same port once one was chosen) and forward new connections."""
        if self._listener is not None:
            return
        listener = socket.create_server((self.host, self.port))  # SO_REUSEADDR on POSIX
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._wake = socket.socketpair()
        self._acceptor = threading.Thread(
            target=self._accept_loop,
            args=(listener, self._wake[0]),
            name=f"proxy-accept-{self.port}",
            daemon=True,
        )
        self._acceptor.start()

    def stop(self) -> None:
        """Stop listening and cut every open connection; returns once all of it is closed."""
        if self._listener is None:
            return
        assert self._wake is not None
        assert self._acceptor is not None
        self._wake[1].send(b"x")
        self._acceptor.join(_JOIN_SECONDS)
        for sock in (self._listener, *self._wake):
            sock.close()
        self._listener = self._wake = self._acceptor = None
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            pair.cut()
        # A connection being set up while we cut may start its second pump late: join until
        # no forwarding thread is left.
        deadline = time.monotonic() + _JOIN_SECONDS
        while time.monotonic() < deadline:
            with self._lock:
                threads = list(self._threads)
            if not threads:
                break
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> Proxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _accept_loop(self, listener: socket.socket, wake: socket.socket) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(listener, selectors.EVENT_READ)
            selector.register(wake, selectors.EVENT_READ)
            while True:
                ready = {key.fileobj for key, _ in selector.select()}
                if wake in ready:
                    return
                try:
                    client, _ = listener.accept()
                except OSError:
                    continue
                pair = _Pair(client)
                with self._lock:
                    self._pairs.add(pair)
                self._spawn(self._connect, pair)

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:  # started under the lock: stop() never sees an unstarted thread
            self._threads.add(thread)
            thread.start()

    def _connect(self, pair: _Pair) -> None:
        if not self._wait_flowing(pair):  # a hung route: the connection gets no further
            self._finish(pair, last=True)
            return
        try:
            server = socket.create_connection(self.target, timeout=_JOIN_SECONDS)
            server.settimeout(None)
        except OSError:
            pair.cut()
            self._finish(pair, last=True)
            return
        if not pair.attach(server):
            server.close()
            self._finish(pair, last=True)
            return
        self._spawn(self._pump, pair, server, pair.client)
        self._pump(pair, pair.client, server)

    def _pump(self, pair: _Pair, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(_CHUNK):
                if self.latency > 0:
                    time.sleep(self.latency)  # the fault itself: each chunk arrives late
                if not self._wait_flowing(pair):
                    break
                sink.sendall(chunk)
            sink.shutdown(socket.SHUT_WR)  # pass an orderly close on to the other side
        except OSError:
            pair.cut()  # one side broke: break the other one too, as a real network would
        self._finish(pair, last=pair.pump_done())

    def _finish(self, pair: _Pair, *, last: bool) -> None:
        with self._lock:
            self._threads.discard(threading.current_thread())
            if last:
                self._pairs.discard(pair)
        if last:
            pair.close()


@contextmanager
def proxy_to(target_host: str, target_port: int) -> Iterator[Proxy]:
    """A started proxy for the ``with`` block; stopped (connections cut) when it ends."""
    with Proxy(target_host, target_port) as proxy:
        yield proxy
