"""Log output: plain text by default, one JSON object per line with ``FENCEBRIDGE_LOG_FORMAT=json``.

Decision lines (logger ``fencebridge.decisions``) carry their structured fields under the
``fencebridge`` key of ``extra``: hashed tenant and operation, job type, fence, decision or
action. Neither format ever receives a raw identifier or a payload from fencebridge's code.

The broker and HTTP client libraries log whole requests and responses (message bodies and
attributes) at DEBUG, so they are held at INFO even when fencebridge's own level is DEBUG.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from typing import Any

LOG_FORMAT_ENV = "FENCEBRIDGE_LOG_FORMAT"
LOG_LEVEL_ENV = "FENCEBRIDGE_LOG_LEVEL"
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s%(fields)s"
#: libraries whose DEBUG output is the wire itself, payloads and identifiers included
WIRE_LOGGERS = ("botocore", "boto3", "s3transfer", "urllib3", "google", "grpc")


class _Fields(logging.Filter):
    """Renders the structured fields after the message, for the text format."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields: dict[str, Any] = getattr(record, "fencebridge", {}) or {}
        record.fields = "".join(f" {k}={v}" for k, v in fields.items())
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(getattr(record, "fencebridge", {}) or {})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(fmt: str | None = None, level: str | None = None) -> None:
    """Configure the root logger once, from arguments or the environment."""
    chosen = (fmt or os.environ.get(LOG_FORMAT_ENV) or "text").lower()
    handler = logging.StreamHandler()
    if chosen == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.addFilter(_Fields())
        handler.setFormatter(logging.Formatter(_TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel((level or os.environ.get(LOG_LEVEL_ENV) or "INFO").upper())
    floor = max(root.level, logging.INFO)
    for name in WIRE_LOGGERS:
        logging.getLogger(name).setLevel(floor)
