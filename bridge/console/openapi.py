"""The OpenAPI 3.1 document of ``/api/v1``, served at ``/api/v1/openapi.json``.

Written out by hand, not derived from the route table, so that a test comparing the two finds
a route added without its description (or a description without its route).
"""

from __future__ import annotations

from typing import Any

_STATES = ["queued", "claimed", "succeeded", "failed_terminal", "unknown", "quarantined"]
_HASH = {"type": ["string", "null"], "description": "keyed hash (never the raw identifier)"}
_TIME = {"type": ["string", "null"], "format": "date-time"}


def _problems(*statuses: int) -> dict[str, Any]:
    titles = {
        400: "bad input: the detail says which and why",
        401: "no or unknown bearer token",
        403: "the token's role does not allow this",
        404: "no such operation",
        413: "the body is too large",
        415: "the body is not application/json",
    }
    return {
        str(s): {
            "description": titles[s],
            "content": {
                "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
            },
        }
        for s in statuses
    }


def _ok(schema: str) -> dict[str, Any]:
    return {
        "200": {
            "description": "OK",
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
        }
    }


def _query(
    name: str, schema: dict[str, Any], description: str, *, required: bool = False
) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "schema": schema,
        "description": description,
    }


def _json_body(schema: str) -> dict[str, Any]:
    return {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
    }


_PAGE = [
    _query("limit", {"type": "integer", "minimum": 1, "maximum": 500}, "rows per page (50)"),
    _query("cursor", {"type": "string"}, "the previous page's next_cursor, unchanged"),
]


def document() -> dict[str, Any]:
    """A fresh copy of the document."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "fencebridge console API",
            "version": "1",
            "description": "Parked work, counts, figures, the go/no-go check and redrive. "
            "Identifiers appear as keyed hashes only; payload bytes only in the answer to "
            "POST /api/v1/payload (payload role, audited). Every request needs a bearer token "
            "(or, where configured, a trusted proxy's user header).",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": {
            "/api/v1/openapi.json": {
                "get": {
                    "summary": "this document",
                    "responses": {
                        "200": {"description": "OK", "content": {"application/json": {}}},
                        **_problems(400, 401),
                    },
                }
            },
            "/api/v1/counts": {
                "get": {
                    "summary": "row counts by state per subscription, job type and tenant hash",
                    "responses": {**_ok("Counts"), **_problems(400, 401)},
                }
            },
            "/api/v1/rows": {
                "get": {
                    "summary": "rows in one state, oldest first, keyset-paginated",
                    "parameters": [
                        _query("state", {"enum": _STATES}, "the state", required=True),
                        _query("subscription", {"type": "string"}, "only this subscription"),
                        _query("job_type", {"type": "string"}, "only this job type"),
                        *_PAGE,
                    ],
                    "responses": {**_ok("RowPage"), **_problems(400, 401)},
                }
            },
            "/api/v1/rejected": {
                "get": {
                    "summary": "rejected deliveries (conflicts, quarantined), keyset-paginated",
                    "parameters": [
                        _query("kind", {"enum": ["conflict", "quarantined"]}, "only this kind"),
                        _query("open", {"enum": ["true", "false"]}, "only those awaiting a person"),
                        *_PAGE,
                    ],
                    "responses": {**_ok("RejectedPage"), **_problems(400, 401)},
                }
            },
            "/api/v1/operation": {
                "post": {
                    "summary": "one operation: its row, attempts, redrives and rejected deliveries",
                    "description": "The raw identifiers go in the body (never a URL); the "
                    "answer shows their hashes.",
                    "requestBody": _json_body("OperationQuery"),
                    "responses": {**_ok("Operation"), **_problems(400, 401, 413, 415)},
                }
            },
            "/api/v1/redrive": {
                "post": {
                    "summary": "redrive parked work (operator role), audited with the token's name",
                    "requestBody": _json_body("RedriveRequest"),
                    "responses": {**_ok("RedriveReport"), **_problems(400, 401, 403, 413, 415)},
                }
            },
            "/api/v1/checks": {
                "get": {
                    "summary": "the nine go/no-go controls per job type, as `fencebridge check`",
                    "responses": {**_ok("Checks"), **_problems(400, 401)},
                }
            },
            "/api/v1/figures": {
                "get": {
                    "summary": "stalled claims, oldest unknown, quarantines, takeovers over time",
                    "parameters": [
                        _query(
                            "window",
                            {"enum": ["15m", "1h", "6h", "24h"]},
                            "how far back (1h): 15m and 1h per minute, 6h per 5 and 24h per "
                            "15 minutes",
                        )
                    ],
                    "responses": {**_ok("Figures"), **_problems(400, 401)},
                }
            },
            "/api/v1/payload": {
                "post": {
                    "summary": "one operation's payload bytes (payload role), every view audited",
                    "description": "The raw identifiers and a reason go in the body; the view "
                    "is recorded (actor, reason, time) in the operation's audit before the "
                    "bytes are answered.",
                    "requestBody": _json_body("PayloadQuery"),
                    "responses": {
                        **_ok("Payload"),
                        **_problems(400, 401, 403, 404, 413, 415),
                    },
                }
            },
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": _SCHEMAS,
        },
    }


_STATE_COUNTS = {
    "type": "object",
    "properties": {s: {"type": "integer"} for s in _STATES},
    "required": _STATES,
}

_SCHEMAS: dict[str, Any] = {
    "Problem": {
        "type": "object",
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string", "description": "the specific reason"},
        },
        "required": ["title", "status", "detail"],
    },
    "Counts": {
        "type": "object",
        "properties": {
            "counts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "subscription": {"type": "string"},
                        "job_type": {"type": "string"},
                        "tenant": _HASH,
                        "states": _STATE_COUNTS,
                    },
                },
            },
            "totals": _STATE_COUNTS,
        },
        "required": ["counts", "totals"],
    },
    "RowPage": {
        "type": "object",
        "properties": {
            "rows": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "tenant": _HASH,
                        "operation": _HASH,
                        "subscription": {"type": "string"},
                        "job_type": {"type": "string"},
                        "target_class": {"enum": ["A", "B", "C", "D"]},
                        "state": {"enum": _STATES},
                        "fence": {"type": "integer"},
                        "attempts": {"type": "integer"},
                        "max_attempts": {"type": "integer"},
                        "outcome_code": {"type": ["string", "null"]},
                        "created_at": _TIME,
                        "claimed_at": _TIME,
                        "settled_at": _TIME,
                        "lease_expires_at": _TIME,
                    },
                },
            },
            "next_cursor": {"type": ["string", "null"], "description": "null on the last page"},
        },
        "required": ["rows", "next_cursor"],
    },
    "RejectedPage": {
        "type": "object",
        "properties": {
            "rejected": {"type": "array", "items": {"type": "object"}},
            "next_cursor": {"type": ["string", "null"]},
        },
        "required": ["rejected", "next_cursor"],
    },
    "OperationQuery": {
        "type": "object",
        "properties": {"tenant_id": {"type": "string"}, "operation_id": {"type": "string"}},
        "required": ["tenant_id", "operation_id"],
        "additionalProperties": False,
    },
    "Operation": {
        "type": "object",
        "properties": {
            "tenant": _HASH,
            "operation": _HASH,
            "row": {"type": ["object", "null"], "description": "null: no such row"},
            "attempts": {
                "type": "array",
                "items": {"type": "object"},
                "description": "the newest attempts kept for the row, oldest first",
            },
            "redrives": {"type": "array", "items": {"type": "object"}},
            "payload_views": {
                "type": "array",
                "items": {"type": "object"},
                "description": "the audited views of its payload (who, when, why)",
            },
            "rejected": {"type": "array", "items": {"type": "object"}},
        },
        "required": [
            "tenant",
            "operation",
            "row",
            "attempts",
            "redrives",
            "payload_views",
            "rejected",
        ],
    },
    "RedriveRequest": {
        "type": "object",
        "properties": {
            "reason": {"type": "string", "minLength": 1, "description": "recorded in the audit"},
            "dry_run": {"type": "boolean", "description": "true: show what would happen"},
            "states": {"type": "array", "items": {"enum": ["unknown", "quarantined"]}},
            "subscription": {"type": "string"},
            "job_type": {"type": "string"},
            "tenant_id": {"type": "string"},
            "operation_id": {"type": "string", "description": "with tenant_id"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
            "extra_attempts": {"type": "integer", "minimum": 1, "maximum": 10},
            "confirm_not_called": {"type": "boolean", "description": "class D, one operation"},
        },
        "required": ["reason", "dry_run"],
        "additionalProperties": False,
    },
    "RedriveReport": {
        "type": "object",
        "properties": {
            "dry_run": {"type": "boolean"},
            "moved": {"type": "integer"},
            "left": {"type": "integer"},
            "rows": {"type": "array", "items": {"type": "object"}},
            "deliveries": {"type": "array", "items": {"type": "object"}},
        },
        "required": ["dry_run", "moved", "left", "rows", "deliveries"],
    },
    "Checks": {
        "type": "object",
        "properties": {
            "go": {"type": "boolean", "description": "true only if every control holds"},
            "summary": {"type": "string"},
            "job_types": {"type": "array", "items": {"type": "string"}},
            "findings": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "job_type": {"type": "string"},
                        "control": {"type": "integer", "minimum": 1, "maximum": 10},
                        "title": {"type": "string"},
                        "go": {"type": "boolean"},
                        "evidence": {"type": "string"},
                    },
                    "required": ["job_type", "control", "title", "go", "evidence"],
                },
            },
        },
        "required": ["go", "summary", "job_types", "findings"],
    },
    "Figures": {
        "type": "object",
        "properties": {
            "window": {"enum": ["15m", "1h", "6h", "24h"]},
            "bucket_seconds": {"type": "integer"},
            "current": {
                "oneOf": [{"$ref": "#/components/schemas/FigurePoint"}, {"type": "null"}],
            },
            "series": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/FigurePoint"},
                "description": "oldest first; each point is the end of its bucket",
            },
        },
        "required": ["window", "bucket_seconds", "current", "series"],
    },
    "FigurePoint": {
        "type": "object",
        "properties": {
            "at": {"type": "string", "format": "date-time"},
            "stalled": {"type": "integer", "description": "held claims with an expired lease"},
            "oldest_unknown_seconds": {"type": ["number", "null"]},
            "quarantined": {"type": "integer", "description": "in this bucket"},
            "takeovers": {"type": "integer", "description": "in this bucket"},
        },
        "required": ["at", "stalled", "oldest_unknown_seconds", "quarantined", "takeovers"],
    },
    "PayloadQuery": {
        "type": "object",
        "properties": {
            "tenant_id": {"type": "string"},
            "operation_id": {"type": "string"},
            "reason": {"type": "string", "minLength": 1, "description": "recorded in the audit"},
        },
        "required": ["tenant_id", "operation_id", "reason"],
        "additionalProperties": False,
    },
    "Payload": {
        "type": "object",
        "properties": {
            "tenant": _HASH,
            "operation": _HASH,
            "bytes": {"type": ["integer", "null"], "description": "null: the payload is gone"},
            "payload_base64": {"type": ["string", "null"]},
            "payload_text": {"type": ["string", "null"], "description": "null: not UTF-8"},
            "viewed_at": _TIME,
            "viewed_by": {"type": "string"},
            "reason": {"type": "string"},
        },
        "required": [
            "tenant",
            "operation",
            "bytes",
            "payload_base64",
            "payload_text",
            "viewed_at",
            "viewed_by",
            "reason",
        ],
    },
}
