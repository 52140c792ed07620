"""Google's Pub/Sub emulator for the demo and the tests: found, started on a free port,
killed and restarted.

The emulator ships with the Google Cloud CLI (``gcloud components install pubsub-emulator``, or
the Debian/RPM package ``google-cloud-cli-pubsub-emulator``) and needs Java. Its launcher is
found under the SDK root that ``gcloud info`` reports, unless ``FENCEBRIDGE_PUBSUB_EMULATOR``
names it.

The emulator runs as its own process group, so a test can SIGKILL it (Java included) and
restart it on the same port. It keeps everything in memory: after a restart, topics,
subscriptions and unacknowledged messages are gone.

Clients are built with ``PUBSUB_EMULATOR_HOST`` set only while they are constructed (the
client library reads it then), so nothing else in the test process is redirected.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar

from google.api_core import exceptions as api_exceptions
from google.cloud import pubsub_v1

EMULATOR_ENV = "FENCEBRIDGE_PUBSUB_EMULATOR"
EMULATOR_HOST_ENV = "PUBSUB_EMULATOR_HOST"
LAUNCHER = Path("platform", "pubsub-emulator", "bin", "cloud-pubsub-emulator")
PROJECT = "fencebridge-local"
START_TIMEOUT = 120.0

_env_lock = threading.Lock()
T = TypeVar("T")


def find_launcher() -> tuple[Path | None, str]:
    """The emulator's launcher, or None and why it was not found."""
    override = os.environ.get(EMULATOR_ENV)
    if override:
        path = Path(override)
        if path.is_file() and os.access(path, os.X_OK):
            return path, ""
        return None, f"{EMULATOR_ENV}={override} is not an executable file"
    root, why = _sdk_root()
    if root is None:
        return None, why
    launcher = root / LAUNCHER
    if not launcher.is_file():
        return None, (
            f"the Pub/Sub emulator is not installed under the Cloud SDK root {root} (install "
            f"google-cloud-cli-pubsub-emulator, or set {EMULATOR_ENV})"
        )
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return None, "the Pub/Sub emulator needs Java, and none is on PATH"
    return launcher, ""


def _sdk_root() -> tuple[Path | None, str]:
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        return None, f"gcloud is not on PATH (or set {EMULATOR_ENV} to the emulator's launcher)"
    try:
        root = subprocess.run(  # noqa: S603  (gcloud from PATH, fixed arguments)
            [gcloud, "info", "--format=value(installation.sdk_root)"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"`gcloud info` failed: {exc}"
    return (Path(root), "") if root else (None, "`gcloud info` reported no SDK root")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def with_emulator_host(host: str, build: Callable[[], T]) -> T:
    """Build a client while ``PUBSUB_EMULATOR_HOST`` points at ``host``."""
    with _env_lock:
        before = os.environ.get(EMULATOR_HOST_ENV)
        os.environ[EMULATOR_HOST_ENV] = host
        try:
            return build()
        finally:
            if before is None:
                del os.environ[EMULATOR_HOST_ENV]
            else:
                os.environ[EMULATOR_HOST_ENV] = before


class PubSubEmulator:
    """One emulator process on a fixed port; it can be killed and started again."""

    def __init__(
        self, launcher: Path | None, *, port: int | None = None, address: str = "127.0.0.1"
    ) -> None:
        self.launcher = launcher
        self.port = port or free_port()
        self.host = f"{address}:{self.port}"
        self._log_dir = Path(tempfile.mkdtemp(prefix="fencebridge-pubsub-"))
        self._process: subprocess.Popen[bytes] | None = None
        self._publisher: Any = None
        self._subscriber: Any = None

    @classmethod
    def attach(cls, host: str) -> PubSubEmulator:
        """An emulator that runs already, at ``HOST:PORT``; it cannot be started or killed."""
        address, _, port = host.rpartition(":")
        return cls(None, port=int(port), address=address)

    # -- process ----------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the emulator and wait until it answers an RPC."""
        if self.running:
            return
        if self.launcher is None:
            raise RuntimeError(f"the emulator at {self.host} is not run by this process")
        log = (self._log_dir / "emulator.log").open("ab")
        try:
            self._process = subprocess.Popen(  # noqa: S603  (the operator's own emulator)
                [str(self.launcher), "--host=127.0.0.1", f"--port={self.port}"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: kill() reaches the JVM too
            )
        finally:
            log.close()
        self._wait_until_answering()

    def _wait_until_answering(self) -> None:
        end = time.monotonic() + START_TIMEOUT
        probe = self.publisher()
        while True:
            if not self.running:
                raise RuntimeError(f"the Pub/Sub emulator exited early:\n{self.log_tail()}")
            try:
                probe.list_topics(request={"project": f"projects/{PROJECT}"}, timeout=2, retry=None)
                return
            except api_exceptions.GoogleAPICallError:
                if time.monotonic() > end:
                    self.kill()
                    raise RuntimeError(
                        f"the Pub/Sub emulator did not answer within {START_TIMEOUT:.0f}s:\n"
                        f"{self.log_tail()}"
                    ) from None
                time.sleep(0.25)

    def kill(self) -> None:
        """SIGKILL the emulator's whole process group, as a crash would."""
        process, self._process = self._process, None
        if process is None:
            return
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

    def restart(self) -> None:
        """Kill and start again on the same port; all topics and messages are gone."""
        self.kill()
        self.start()

    def stop(self) -> None:
        process, self._process = self._process, None
        for client in (self._publisher, self._subscriber):
            if client is not None:
                with suppress(Exception):
                    client.transport.close()
        self._publisher = self._subscriber = None
        if process is None:
            return
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)

    def log_tail(self, lines: int = 30) -> str:
        path = self._log_dir / "emulator.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    # -- clients ----------------------------------------------------------------------------

    def publisher(self) -> Any:
        """A shared publisher client for this emulator."""
        if self._publisher is None:
            options = pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
            self._publisher = with_emulator_host(
                self.host, lambda: pubsub_v1.PublisherClient(publisher_options=options)
            )
        return self._publisher

    def subscriber(self) -> Any:
        """A shared subscriber client for test set-up and inspection (a consumer gets its own,
        from :func:`consumers.pubsub.source.subscriber_client`)."""
        if self._subscriber is None:
            self._subscriber = with_emulator_host(self.host, pubsub_v1.SubscriberClient)
        return self._subscriber

    # -- resources --------------------------------------------------------------------------

    def create(
        self, name: str | None = None, *, ack_deadline: int = 10, **options: Any
    ) -> tuple[str, str]:
        """A topic and one subscription on it; returns (topic path, subscription path).

        ``options`` are Subscription fields (``enable_exactly_once_delivery``,
        ``enable_message_ordering``, ``dead_letter_policy``...).
        """
        name = name or f"fb-{uuid.uuid4().hex[:12]}"
        topic = self.publisher().topic_path(PROJECT, name)
        path = self.subscriber().subscription_path(PROJECT, name)
        self.publisher().create_topic(request={"name": topic})
        self.subscriber().create_subscription(
            request={"name": path, "topic": topic, "ack_deadline_seconds": ack_deadline, **options}
        )
        return topic, path

    def publish(self, topic: str, data: bytes, ordering_key: str = "", **attributes: str) -> str:
        """Publish one message and wait for its message id."""
        future = self.publisher().publish(topic, data, ordering_key=ordering_key, **attributes)
        message_id: str = future.result(timeout=30)
        return message_id

    def publish_many(
        self, topic: str, messages: Sequence[tuple[bytes, dict[str, str]]]
    ) -> list[str]:
        """Publish messages (data, attributes) at once; returns their ids in order."""
        futures = [self.publisher().publish(topic, data, **attrs) for data, attrs in messages]
        return [str(f.result(timeout=60)) for f in futures]

    def deliverable(self, subscription: str) -> list[Any]:
        """Every message not acknowledged yet, whether outstanding with a consumer or not.

        Seeking a subscription to a snapshot of itself makes each unacknowledged message
        deliverable at once (outstanding ack deadlines are reset), so nothing in flight is
        missed. The messages are then pulled until the emulator has none left; they stay
        unacknowledged. Call this only when no consumer is running on the subscription.
        """
        sub = self.subscriber()
        snapshot = sub.snapshot_path(PROJECT, f"count-{uuid.uuid4().hex[:12]}")
        sub.create_snapshot(request={"name": snapshot, "subscription": subscription})
        try:
            sub.seek(request={"subscription": subscription, "snapshot": snapshot})
        finally:
            sub.delete_snapshot(request={"snapshot": snapshot})
        found: dict[str, Any] = {}
        while True:
            # The emulator answers at once when it has messages; with none, it holds the pull
            # until shortly before the call's deadline and answers empty: nothing is left.
            response = sub.pull(
                request={"subscription": subscription, "max_messages": 1000},
                timeout=3,
                retry=None,
            )
            if not response.received_messages:
                return list(found.values())
            for received in response.received_messages:
                found[received.message.message_id] = received.message
