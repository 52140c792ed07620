"""``/healthz`` and ``/readyz`` on a local port, for probes and load balancers.

``/readyz`` answers 200 only when every check passes (the database reachable for claims, every
consumer receiving) and every supervised service of the core is running without failing, and
503 otherwise, with the reasons: ``checks`` by component, and ``services`` for each service
that is not running well (the key is absent when all are).

``/healthz`` answers 200 while the process can serve at all (liveness: restart me if not):
503, naming the services, once a service's thread has ended or a service has failed past its
limits (:class:`~bridge.service.Limits`: failing for 5 minutes, or 50 restarts in a row, by
default). A database or broker that cannot be reached never fails liveness: a restart would
not bring it back.

Reasons name subscriptions, services and error types, never tenants, operations or payloads.
The endpoint itself runs as a supervised service, one request per round.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bridge.service import Backoff, Deadline, Limits, Service, Supervised, describe

Check = Callable[[], tuple[bool, str]]
#: how long one round waits for a request; a stop is noticed within it
ROUND_SECONDS = 0.2


class HealthServer:
    def __init__(
        self,
        host: str,
        port: int,
        checks: dict[str, Check],
        *,
        services: Callable[[], Iterable[Service]] | None = None,
        limits: Limits | None = None,
        on_restart: Callable[[str], None] | None = None,
    ) -> None:
        self._checks = checks
        self._services = services or (lambda: ())
        health = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    live, failing = health.liveness()
                    if live:
                        self._send(200, {"status": "ok"})
                    else:
                        self._send(503, {"status": "failing", "services": failing})
                elif path == "/readyz":
                    ready, reasons, services = health.report()
                    body: dict[str, Any] = {"ready": ready, "checks": reasons}
                    if services:
                        body["services"] = services
                    self._send(200 if ready else 503, body)
                else:
                    self._send(404, {"error": "not found"})

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                """Probes every few seconds are not worth a log line."""

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._server.timeout = ROUND_SECONDS
        self.service = Supervised(
            "health",
            self._server.handle_request,
            backoff=Backoff(cap=1.0),
            limits=limits,
            on_restart=on_restart,
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def _statuses(self) -> dict[str, tuple[bool, bool, str]]:
        found: dict[str, tuple[bool, bool, str]] = {}
        for service in [*self._services(), self.service]:
            try:
                s = service.status()
            except Exception as exc:  # noqa: BLE001  (a failing status means not ready)
                found[service.name] = (False, True, f"status failed: {describe(exc)}")
            else:
                found[s.name] = (s.ready, s.live, s.reason)
        return found

    def readiness(self) -> tuple[bool, dict[str, str]]:
        """The consumers' and components' checks (services are in :meth:`report`)."""
        reasons: dict[str, str] = {}
        ready = True
        for name, check in self._checks.items():
            try:
                ok, why = check()
            except Exception as exc:  # noqa: BLE001  (a failing check means not ready)
                ok, why = False, f"check failed: {type(exc).__name__}"
            reasons[name] = why
            ready = ready and ok
        return ready, reasons

    def report(self) -> tuple[bool, dict[str, str], dict[str, str]]:
        """Ready or not, the checks' reasons, and the reasons of the services not ready."""
        ready, reasons = self.readiness()
        services = {name: why for name, (ok, _, why) in self._statuses().items() if not ok}
        return ready and not services, reasons, services

    def liveness(self) -> tuple[bool, dict[str, str]]:
        """Live or not, and the reasons of the services that are not."""
        failing = {name: why for name, (_, live, why) in self._statuses().items() if not live}
        return not failing, failing

    def start(self) -> None:
        self.service.start()

    def stop(self, deadline: float | Deadline = 5.0) -> None:
        self.service.stop(deadline)
        self._server.server_close()
