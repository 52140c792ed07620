"""``fencebridge check`` on an SQS subscription: the queue exists, and its settings suit the
bridge (read with ``GetQueueAttributes``; nothing is received, deleted or changed).

* a queue that does not exist is a no-go (the bridge would retry its receives forever);
* no redrive policy (dead-letter queue) is a warning: a message the rules can never write is
  received again until its retention ends;
* a FIFO queue with ``after_outcome`` is a warning: a held message holds back its whole group;
* a hold (``after_outcome``) that can outlast SQS's 12 hours of visibility per receive (the
  lease times the attempts) is a warning: past it the message comes back while its row runs;
* a retention longer than the tombstones are kept is a warning: an erased operation delivered
  after its tombstone was purged would be new work.
"""

from __future__ import annotations

import json
from typing import Any, Final

from bridge.adapters.kit import BrokerExpectations, BrokerFinding, SubscriptionConfig
from bridge.errors import BrokerUnavailable

#: SQS's ceiling on a message's visibility, counted from its receive (seconds)
VISIBILITY_CEILING_SECONDS: Final = 12 * 3600
_MISSING: Final = ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")


def inspect_queue(sub: SubscriptionConfig, expected: BrokerExpectations) -> list[BrokerFinding]:
    import boto3  # noqa: PLC0415  (only when an SQS subscription is checked)
    from botocore.config import Config  # noqa: PLC0415
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

    from consumers.sqs.source import SqsSettings  # noqa: PLC0415

    settings = SqsSettings.of(sub)
    url = str(settings.queue_url)
    try:
        client = boto3.session.Session().client(
            "sqs",
            region_name=settings.region,
            endpoint_url=settings.endpoint_url,
            config=Config(connect_timeout=5, read_timeout=10, retries={"total_max_attempts": 2}),
        )
        answer = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in _MISSING:
            return [BrokerFinding(f"queue {url} does not exist", go=False)]
        return [BrokerFinding(f"queue {url}: GetQueueAttributes refused ({code})", go=False)]
    except BotoCoreError as exc:
        raise BrokerUnavailable(f"SQS at {url} cannot be asked: {type(exc).__name__}") from exc
    attributes: dict[str, Any] = {str(k): v for k, v in answer.get("Attributes", {}).items()}
    return judge(url, attributes, sub, expected)


def judge(
    url: str, attributes: dict[str, Any], sub: SubscriptionConfig, expected: BrokerExpectations
) -> list[BrokerFinding]:
    """The findings of a queue's attributes (as ``GetQueueAttributes`` returns them)."""
    held = sub.ack_mode.value == "after_outcome"
    fifo = attributes.get("FifoQueue") == "true"
    visibility = int(attributes.get("VisibilityTimeout", 30))
    retention = int(attributes.get("MessageRetentionPeriod", 345600))
    found = [
        BrokerFinding(
            f"queue {url} exists: {'FIFO' if fifo else 'standard'}, default visibility "
            f"{visibility} s, retention {retention // 3600} h"
        )
    ]
    redrive = attributes.get("RedrivePolicy")
    if redrive:
        policy = json.loads(redrive)
        target = str(policy.get("deadLetterTargetArn", "?")).rsplit(":", 1)[-1]
        found.append(BrokerFinding(f"DLQ {target} after {policy.get('maxReceiveCount')} receives"))
    else:
        found.append(
            BrokerFinding(
                f"queue {url} has no redrive policy (DLQ): a message the rules can never write "
                "is received again until its retention ends",
                warning=True,
            )
        )
    if fifo and held:
        found.append(
            BrokerFinding(
                f"queue {url} is FIFO and the subscription holds deliveries (after_outcome): a "
                "held message holds back its whole message group until its row settles",
                warning=True,
            )
        )
    longest_hold = expected.hold_seconds
    if held and longest_hold > VISIBILITY_CEILING_SECONDS:
        found.append(
            BrokerFinding(
                f"queue {url}: a held delivery can last {longest_hold / 3600:.1f} h (lease times "
                "attempts), past SQS's 12 h visibility per receive: it would come back while "
                "its row runs",
                warning=True,
            )
        )
    if expected.tombstone_days is not None and retention > expected.tombstone_days * 86400:
        found.append(
            BrokerFinding(
                f"queue {url} keeps messages {retention // 86400} d, longer than tombstones "
                f"({expected.tombstone_days} d): an erased operation delivered later would be "
                "new work",
                warning=True,
            )
        )
    return found
