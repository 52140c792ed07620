"""A silent network partition of one loopback port: its packets dropped, nothing reset.

:func:`partition` adds two iptables rules to the ``INPUT`` chain: every TCP packet sent to the
port and every one sent from it is dropped (``DROP``, never ``REJECT``: no RST, no ICMP, each
side sees only silence, as when a route fails). On loopback every packet passes ``INPUT``, so
the two rules cut both directions of every connection to the port, new ones included (their
SYN is dropped). Unlike a proxy that stops forwarding (:meth:`tests.support.proxy.Proxy.hang`),
nothing acknowledges the bytes sent: the sender's TCP keepalives and ``TCP_USER_TIMEOUT`` fire
as they do on a real network.

The rules carry a comment unique to the partition (``-m comment``); :meth:`Partition.heal`
deletes every rule carrying it, found by listing the chain, so a rule is never left behind by a
failed test, and a heal can be repeated.

The binary is Debian's ``iptables`` package (``.ci/run`` installs it when missing), and changing
rules needs root (``CAP_NET_ADMIN``). Without either the test is skipped, except in CI
(``CI=true``), where it fails instead of silently skipping.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

CHAIN = "INPUT"
#: where Debian installs it, outside an unprivileged user's PATH
SBIN = "/usr/sbin:/sbin"
#: seconds an iptables call waits for the rules' lock (other processes change them too)
LOCK_WAIT_SECONDS = 10
TIMEOUT_SECONDS = 30.0


def _iptables() -> tuple[str | None, str]:
    """The binary, or ``None`` and why it cannot be used here."""
    found = shutil.which("iptables") or shutil.which("iptables", path=SBIN)
    if found is None:
        return None, "no iptables on PATH (apt-get install iptables)"
    try:
        listed = subprocess.run(
            [found, "-w", str(LOCK_WAIT_SECONDS), "-S", CHAIN],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"iptables cannot run: {exc}"
    if listed.returncode != 0:
        return None, f"iptables cannot list {CHAIN} (root needed): {listed.stderr.strip()}"
    return found, ""


def require_iptables() -> str:
    """The binary, usable; otherwise skip the test, or fail it under CI."""
    binary, why = _iptables()
    if binary is not None:
        return binary
    reason = f"iptables unavailable: {why}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


class Partition:
    """The rules dropping every TCP packet to and from ``port`` on ``host``, while in place."""

    def __init__(self, binary: str, port: int, *, host: str = "127.0.0.1") -> None:
        self._binary = binary
        self.port = port
        self.host = host
        self.tag = f"fencebridge-test-partition-{os.getpid()}-{port}-{secrets.token_hex(4)}"

    def _rules(self) -> list[list[str]]:
        comment = ["-m", "comment", "--comment", self.tag]
        to_port = ["-p", "tcp", "-d", self.host, "--dport", str(self.port)]
        from_port = ["-p", "tcp", "-s", self.host, "--sport", str(self.port)]
        return [[*to_port, *comment, "-j", "DROP"], [*from_port, *comment, "-j", "DROP"]]

    def _run(self, *args: str) -> str:
        done = subprocess.run(
            [self._binary, "-w", str(LOCK_WAIT_SECONDS), *args],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_SECONDS,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"iptables {shlex.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def drop(self) -> None:
        """Drop from now on (the rules go first in the chain); nothing is sent to either side."""
        if self.active:
            return
        try:
            for rule in self._rules():
                self._run("-I", CHAIN, *rule)
        except BaseException:
            self.heal()
            raise

    def placed(self) -> list[str]:
        """The rules in place carrying this partition's comment, as ``iptables -S`` lists them."""
        return [line for line in self._run("-S", CHAIN).splitlines() if self.tag in line]

    @property
    def active(self) -> bool:
        return bool(self.placed())

    def heal(self) -> None:
        """Delete every rule carrying this partition's comment; packets flow again."""
        for line in self.placed():
            words = shlex.split(line)
            if words[:1] == ["-A"]:
                self._run("-D", *words[1:])
        left = self.placed()
        if left:
            raise RuntimeError(f"partition rules left in place: {left}")


@contextmanager
def partition(port: int, *, host: str = "127.0.0.1") -> Iterator[Partition]:
    """Packets to and from ``port`` dropped for the ``with`` block (or until
    :meth:`Partition.heal`); every rule deleted when it ends, whatever happened."""
    cut = Partition(require_iptables(), port, host=host)
    try:
        cut.drop()
        yield cut
    finally:
        cut.heal()
