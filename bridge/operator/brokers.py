"""What ``fencebridge check`` reads from the brokers: each subscription's queue or subscription
must exist, and its settings are compared with what the bridge expects of them (each adapter's
``inspect_broker``; nothing is received or acknowledged).

Control 8 (ack after commit) reports it: a queue or subscription that does not exist is a no-go
naming it, a setting to look at a warning, and a broker that could not be asked leaves the
control "not probed" with the reason, never a go over something that did not run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from bridge.adapters import sources
from bridge.adapters.sources import BrokerExpectations, BrokerFinding
from bridge.config import BridgeConfig, SubscriptionConfig
from bridge.errors import FenceBridgeError


@dataclass(frozen=True, slots=True)
class BrokerLook:
    """One subscription's queue or subscription as the broker described it."""

    findings: tuple[BrokerFinding, ...] = ()
    #: why the broker was not asked (no inspection in the adapter, or it could not be reached)
    not_probed: str | None = None
    warnings: tuple[str, ...] = field(default=())


def expectations(config: BridgeConfig, sub: SubscriptionConfig) -> BrokerExpectations:
    jobs = [config.jobs[j] for j in sub.job_types if j in config.jobs]
    lease = max((j.lease_seconds for j in jobs), default=0.0)
    hold = max((j.lease_seconds * j.max_attempts for j in jobs), default=0.0)
    plan = config.retention
    return BrokerExpectations(
        lease_seconds=lease,
        hold_seconds=hold,
        tombstone_days=plan.tombstone_days if plan is not None else None,
    )


def inspect_brokers(config: BridgeConfig) -> Mapping[str, BrokerLook]:
    """Each subscription's look at its broker, by subscription name."""
    looks: dict[str, BrokerLook] = {}
    for name, sub in config.subscriptions.items():
        looks[name] = _look(config, sub)
    return looks


def _look(config: BridgeConfig, sub: SubscriptionConfig) -> BrokerLook:
    try:
        adapter = sources.adapter(sub.source)
    except FenceBridgeError as exc:
        return BrokerLook(not_probed=f"no adapter: {exc}")
    if adapter.inspect_broker is None:
        return BrokerLook(not_probed=f"the {sub.source} adapter cannot inspect its broker")
    try:
        found = adapter.inspect_broker(sub, expectations(config, sub))
    except FenceBridgeError as exc:
        return BrokerLook(not_probed=str(exc))
    return BrokerLook(
        findings=tuple(found), warnings=tuple(f.text for f in found if f.go and f.warning)
    )
