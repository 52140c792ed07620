"""``/healthz`` and ``/readyz`` on a local port, for probes and load balancers.

``/healthz`` answers 200 while the process can serve at all (liveness: restart me if not).
``/readyz`` answers 200 only when every check passes — the database reachable for claims, every
consumer receiving — and 503 with the reasons otherwise. Reasons name subscriptions and
components, never tenants, operations or payloads.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Check = Callable[[], tuple[bool, str]]


class HealthServer:
    def __init__(self, host: str, port: int, checks: dict[str, Check]) -> None:
        self._checks = checks
        health = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    self._send(200, {"status": "ok"})
                elif path == "/readyz":
                    ready, reasons = health.readiness()
                    self._send(200 if ready else 503, {"ready": ready, "checks": reasons})
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
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fencebridge-health", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def readiness(self) -> tuple[bool, dict[str, str]]:
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

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
