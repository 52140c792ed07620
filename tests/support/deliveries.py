"""Deliveries for tests that put work in place with the store, as a consumer would have."""

from __future__ import annotations

import json

from bridge.executors.registry import Registry
from bridge.types import Delivery, TargetClass


def delivery(
    op: str,
    *,
    tenant: str = "t1",
    subscription: str = "refunds",
    job_type: str = "refund",
    max_attempts: int = 5,
    ordering_key: str | None = None,
    payload: bytes | None = None,
    priority: int = 0,
) -> Delivery:
    """A class A delivery whose payload, unless given, is ``{"op": "<op>"}``."""
    return Delivery(
        tenant_id=tenant,
        operation_id=op,
        subscription=subscription,
        job_type=job_type,
        target_class=TargetClass.A,
        payload=payload if payload is not None else f'{{"op": "{op}"}}'.encode(),
        max_attempts=max_attempts,
        ordering_key=ordering_key,
        priority=priority,
    )


def for_job(
    registry: Registry,
    job: str,
    operation: str,
    payload: object = None,
    *,
    tenant: str = "t1",
    subscription: str = "jobs",
) -> Delivery:
    """A delivery of a registered job: its target class and attempts are the registration's."""
    spec = registry[job]
    return Delivery(
        tenant_id=tenant,
        operation_id=operation,
        subscription=subscription,
        job_type=job,
        target_class=spec.target_class,
        payload=json.dumps(payload if payload is not None else {}).encode(),
        max_attempts=spec.retry.max_attempts,
    )
