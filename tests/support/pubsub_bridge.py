"""``fencebridge run`` on a Pub/Sub subscription of the emulator, and a backlog to feed it.

:class:`PubSubBridgeConfig` is the Pub/Sub twin of
:class:`~tests.support.bridge_process.SqsBridgeConfig`: one subscription, tenant and operation
from attributes. :func:`backlog` builds the awkward stream the volume tests publish: operations
over several tenants (colliding operation ids across tenants), a share of them published twice,
a few republished with another payload (conflicts), and ordering keys on part of them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.bridge_process import BridgeProcess, Job, free_port, jobs_toml


@dataclass(frozen=True, slots=True, kw_only=True)
class PubSubBridgeConfig:
    """A bridge with one Pub/Sub subscription, decoding tenant and operation from attributes."""

    subscription_path: str
    jobs: Mapping[str, Job]
    health_port: int = field(default_factory=free_port)
    subscription: str = "orders"
    ack_mode: str = "after_inbox"
    consumers: int = 1
    worker_threads: int = 8
    poll_interval_seconds: float = 0.2
    sweep_interval_seconds: float = 1.0
    shutdown_deadline_seconds: float = 10.0
    max_lease_duration_seconds: int = 600

    def toml(self) -> str:
        jobs, job_types = jobs_toml(self.jobs)
        return f"""[bridge]
worker_threads = {self.worker_threads}
poll_interval_seconds = {self.poll_interval_seconds}
sweep_interval_seconds = {self.sweep_interval_seconds}
shutdown_deadline_seconds = {self.shutdown_deadline_seconds}
health_port = {self.health_port}
{jobs}
[subscriptions.{self.subscription}]
source = "pubsub"
subscription = "{self.subscription_path}"
ack_mode = "{self.ack_mode}"
consumers = {self.consumers}
job_types = [{job_types}]
flow_control = {{ max_messages = 1000, max_lease_duration_seconds = {
            self.max_lease_duration_seconds
        } }}

[subscriptions.{self.subscription}.decode]
tenant_id = "attribute:tenant_id"
operation_id = "attribute:operation_id"
job_type = "attribute:job_type"
payload = "body"
"""

    def start(self, directory: Path, env: Mapping[str, str], name: str) -> BridgeProcess:
        path = directory / f"{name}.toml"
        path.write_text(self.toml(), encoding="utf-8")
        return BridgeProcess(path, env, health_port=self.health_port)


@dataclass(frozen=True, slots=True)
class Publication:
    data: bytes
    attributes: dict[str, str]
    ordering_key: str = ""


@dataclass(frozen=True, slots=True)
class Backlog:
    """What was published, and what the inbox must make of it."""

    publications: list[Publication]
    #: (tenant, operation) of every distinct operation
    operations: set[tuple[str, str]]
    #: operations republished with another payload: one rejected conflict each
    conflicts: set[tuple[str, str]]


def backlog(
    operations: int,
    *,
    job_type: str,
    tenants: int = 3,
    duplicates: float = 0.10,
    conflicts: float = 0.01,
    ordered: float = 0.3,
    payload: Mapping[str, Any] | None = None,
    slow: Mapping[str, Any] | None = None,
    slow_share: float = 0.0,
    seed: int = 16,
) -> Backlog:
    """``operations`` operations spread over ``tenants`` tenants, shuffled with their copies.

    Operation ids repeat across tenants (tenant ``t1`` and ``t2`` both have ``op-7``). A share
    ``slow_share`` of them carries ``slow`` as payload instead of ``payload``.
    """
    rnd = random.Random(seed)
    pubs: list[Publication] = []
    ops: set[tuple[str, str]] = set()
    conflicted: set[tuple[str, str]] = set()
    per_tenant = -(-operations // tenants)
    n = 0
    for t in range(1, tenants + 1):
        for i in range(per_tenant):
            if n == operations:
                break
            n += 1
            tenant, op = f"t{t}", f"op-{i}"
            ops.add((tenant, op))
            body = dict(slow if slow is not None and rnd.random() < slow_share else payload or {})
            body["n"] = i
            attrs = {"tenant_id": tenant, "operation_id": op, "job_type": job_type}
            key = f"{tenant}-k{i % 7}" if rnd.random() < ordered else ""
            first = Publication(json.dumps(body).encode(), attrs, key)
            pubs.append(first)
            if rnd.random() < duplicates:
                pubs.append(first)
            if rnd.random() < conflicts:
                changed = dict(body, changed=True)
                pubs.append(Publication(json.dumps(changed).encode(), attrs, key))
                conflicted.add((tenant, op))
    # Keep each ordering key's publications in order; shuffle the unordered ones among them.
    unordered = [p for p in pubs if not p.ordering_key]
    rnd.shuffle(unordered)
    ordered_pubs = [p for p in pubs if p.ordering_key]
    merged: list[Publication] = []
    while unordered or ordered_pubs:
        take_ordered = ordered_pubs and (not unordered or rnd.random() < 0.3)
        merged.append(ordered_pubs.pop(0) if take_ordered else unordered.pop())
    return Backlog(merged, ops, conflicted)
