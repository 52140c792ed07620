"""The partition the database tests rely on: packets to and from one port dropped, both ways,
silently (the sender's ``TCP_USER_TIMEOUT`` fires, nothing is refused), and every rule gone
after a heal or a failure."""

from __future__ import annotations

import errno
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.partition import CHAIN, partition, require_iptables

pytestmark = pytest.mark.slow
USER_TIMEOUT_MS = 1000


@pytest.fixture
def echo() -> Iterator[int]:
    """A loopback server that echoes what each connection sends; its port."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(1024):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        acceptor.join(5)
        server.close()


def client(port: int) -> socket.socket:
    """A connection whose unacknowledged bytes (and SYN) give up after a second."""
    sock = socket.socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)
    sock.settimeout(15)
    try:
        sock.connect(("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock


def round_trip(sock: socket.socket) -> bytes:
    sock.sendall(b"ping")
    return sock.recv(16)


def listed(tag: str) -> list[str]:
    rules = subprocess.run(
        [require_iptables(), "-w", "10", "-S", CHAIN], capture_output=True, text=True, check=True
    ).stdout
    return [line for line in rules.splitlines() if tag in line]


def test_a_partition_drops_both_ways_without_a_reset_and_heals(echo: int) -> None:
    with client(echo) as before:
        assert round_trip(before) == b"ping"
        with partition(echo) as cut:
            assert len(listed(cut.tag)) == 2
            started = time.monotonic()
            with pytest.raises(TimeoutError) as sent:
                round_trip(before)
            assert sent.value.errno == errno.ETIMEDOUT  # the user timeout, not a reset
            assert time.monotonic() - started < 10
            with pytest.raises(TimeoutError) as connecting:
                client(echo).close()
            assert connecting.value.errno == errno.ETIMEDOUT  # the SYN dropped, not refused
            cut.heal()
            assert not cut.active
            cut.heal()  # again: nothing left to delete
            with client(echo) as after:
                assert round_trip(after) == b"ping"
        assert listed(cut.tag) == []


def fail_inside(port: int, tags: list[str]) -> None:
    """A ``with partition`` block that fails; the partition's tag goes into ``tags``."""
    with partition(port) as cut:
        tags.append(cut.tag)
        assert cut.active
        raise RuntimeError("the test failed")


def test_the_rules_are_deleted_when_the_block_fails(echo: int) -> None:
    tags: list[str] = []
    with pytest.raises(RuntimeError, match="the test failed"):
        fail_inside(echo, tags)
    assert len(tags) == 1
    assert listed(tags[0]) == []
    with client(echo) as after:
        assert round_trip(after) == b"ping"
