"""Class B on DynamoDB: the item stores ``last_fence``; writes carry a ConditionExpression.

``put`` and ``update`` add ``attribute_not_exists(last_fence) OR last_fence <= :fence`` to the
request itself, so DynamoDB refuses a write from a stale claim. A
``ConditionalCheckFailedException`` becomes :class:`~bridge.errors.FencedOut` (never retried);
other client errors are left to the executor's classification.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from bridge.errors import FencedOut
from bridge.handlers import Context

FENCE_ATTRIBUTE = "last_fence"
_CONDITION = "attribute_not_exists(#fence) OR #fence <= :fence"


def _refused(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


def fenced_put(table: Any, item: Mapping[str, Any], ctx: Context) -> None:
    """Put the whole item, stamped with the claim's fence, unless a higher fence wrote it."""
    try:
        table.put_item(
            Item={**item, FENCE_ATTRIBUTE: ctx.fence},
            ConditionExpression=_CONDITION,
            ExpressionAttributeNames={"#fence": FENCE_ATTRIBUTE},
            ExpressionAttributeValues={":fence": ctx.fence},
        )
    except ClientError as exc:
        if _refused(exc):
            raise FencedOut(ctx.tenant_id, ctx.operation_id, ctx.fence, "dynamodb put") from exc
        raise


def fenced_update(
    table: Any, key: Mapping[str, Any], values: Mapping[str, Any], ctx: Context
) -> None:
    """Set attributes (never increment: a takeover may repeat the write) under the fence."""
    names = {f"#a{i}": name for i, name in enumerate(values)}
    vals = {f":v{i}": value for i, value in enumerate(values.values())}
    assignments = ", ".join(f"#a{i} = :v{i}" for i in range(len(values)))
    try:
        table.update_item(
            Key=dict(key),
            UpdateExpression=f"SET {assignments}, #fence = :fence",
            ConditionExpression=_CONDITION,
            ExpressionAttributeNames={**names, "#fence": FENCE_ATTRIBUTE},
            ExpressionAttributeValues={**vals, ":fence": ctx.fence},
        )
    except ClientError as exc:
        if _refused(exc):
            raise FencedOut(ctx.tenant_id, ctx.operation_id, ctx.fence, "dynamodb update") from exc
        raise
