"""``fencebridge check`` on a Pub/Sub subscription: it exists, and its settings suit the bridge
(read with ``GetSubscription``; nothing is pulled, acked or changed).

* a subscription that does not exist is a no-go (the bridge's stream would retry forever);
* a subscription held (``after_outcome``) without exactly-once delivery is a warning: an ack
  is best effort, so a settled delivery can come back (as a replay);
* an ack deadline shorter than 10 s is a warning: the bridge's inbox write must fit in it;
* no dead-letter policy is a warning: a message the rules can never write comes back until its
  retention ends;
* a retention longer than the tombstones are kept (or acked messages retained, which a seek can
  deliver again) is a warning: an erased operation delivered later would be new work.
Message ordering is reported as found: the bridge keeps each ordering key's order.
"""

from __future__ import annotations

from typing import Any, Final

from bridge.adapters.kit import BrokerExpectations, BrokerFinding, SubscriptionConfig
from bridge.errors import BrokerUnavailable

#: the shortest ack deadline the inbox's write is expected to fit in (seconds)
ACK_DEADLINE_FLOOR_SECONDS: Final = 10


def inspect_subscription(
    sub: SubscriptionConfig, expected: BrokerExpectations
) -> list[BrokerFinding]:
    from google.api_core import exceptions  # noqa: PLC0415

    from consumers.pubsub.source import PubSubSettings, subscriber_client  # noqa: PLC0415

    path = str(PubSubSettings.of(sub).subscription)
    client = subscriber_client()
    try:
        found = client.get_subscription(request={"subscription": path}, timeout=10)
    except exceptions.NotFound:
        return [BrokerFinding(f"subscription {path} does not exist", go=False)]
    except exceptions.PermissionDenied as exc:
        return [
            BrokerFinding(f"subscription {path}: reading it was refused ({exc.code})", go=False)
        ]
    except (exceptions.GoogleAPICallError, exceptions.RetryError) as exc:
        raise BrokerUnavailable(
            f"Pub/Sub cannot be asked about {path}: {type(exc).__name__}"
        ) from exc
    finally:
        close = getattr(client, "close", None)
        if close is not None:
            close()
    return judge(path, found, sub, expected)


def judge(
    path: str, found: Any, sub: SubscriptionConfig, expected: BrokerExpectations
) -> list[BrokerFinding]:
    """The findings of a subscription as ``GetSubscription`` returns it."""
    held = sub.ack_mode.value == "after_outcome"
    exactly_once = bool(found.enable_exactly_once_delivery)
    deadline = int(found.ack_deadline_seconds)
    retention = found.message_retention_duration
    retention_seconds = int(retention.total_seconds()) if retention else 7 * 86400
    findings = [
        BrokerFinding(
            f"subscription {path} exists: exactly-once {'on' if exactly_once else 'off'}, ack "
            f"deadline {deadline} s, ordering {'on' if found.enable_message_ordering else 'off'}"
            f", retention {retention_seconds // 3600} h"
        )
    ]
    if held and not exactly_once:
        findings.append(
            BrokerFinding(
                f"subscription {path} holds deliveries (after_outcome) without exactly-once "
                "delivery: its acks are best effort, so a settled delivery can come back (a "
                "replay)",
                warning=True,
            )
        )
    if deadline < ACK_DEADLINE_FLOOR_SECONDS:
        findings.append(
            BrokerFinding(
                f"subscription {path}: ack deadline {deadline} s, under "
                f"{ACK_DEADLINE_FLOOR_SECONDS} s: a delivery can expire before its write commits",
                warning=True,
            )
        )
    policy = found.dead_letter_policy
    if policy and policy.dead_letter_topic:
        findings.append(
            BrokerFinding(
                f"dead letters to {policy.dead_letter_topic.rsplit('/', 1)[-1]} after "
                f"{policy.max_delivery_attempts} attempts"
            )
        )
    else:
        findings.append(
            BrokerFinding(
                f"subscription {path} has no dead-letter policy: a message the rules can never "
                "write comes back until its retention ends",
                warning=True,
            )
        )
    days = expected.tombstone_days
    acked = " (acked ones too: a seek delivers them again)" if found.retain_acked_messages else ""
    if days is not None and (retention_seconds > days * 86400 or acked):
        findings.append(
            BrokerFinding(
                f"subscription {path} keeps messages {retention_seconds // 86400} d{acked}, "
                f"against tombstones kept {days} d: an erased operation delivered later would be "
                "new work",
                warning=True,
            )
        )
    return findings
