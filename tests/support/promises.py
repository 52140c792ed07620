"""The product's promises, each with an id: the one list (docs/operations.md, "Promises", is
rendered from it and a unit test keeps the two equal).

A test names the promise it guards with ``@pytest.mark.promise("id")``, and the suite refuses
to run (at collection) when a promise has no test in the fast tier (neither ``slow`` nor
``alone``): ``make test`` must be able to break on every promise.
"""

from __future__ import annotations

from typing import Final

#: id -> what is promised, in one sentence
PROMISES: Final[dict[str, str]] = {
    "fence-refusal": (
        "a write carrying a stale fence is refused inside the write, by the store or the target"
    ),
    "replay-conflict": (
        "a delivery with the stored payload hash is a replay (no new work); another hash is a "
        "recorded conflict that mutates nothing"
    ),
    "colliding-tenants": (
        "tenants with the same operation ids never touch each other's rows, keys or hashes"
    ),
    "class-c-lookup": (
        "a class C attempt after an ambiguous one looks up by idempotency key before acting, "
        "so a provider never applies an operation twice"
    ),
    "class-d-unknown": (
        "a class D call that may have left and has no explicit outcome parks as unknown and is "
        "never called again"
    ),
    "ack-after-commit-sqs": (
        "an SQS delivery is deleted only after its inbox transaction committed; a failed "
        "commit acknowledges nothing"
    ),
    "ack-after-commit-pubsub": (
        "a Pub/Sub delivery is acknowledged only after its inbox transaction committed; a "
        "failed commit acknowledges nothing"
    ),
    "erasure-keeps-dedupe": (
        "an erased operation leaves a tombstone, so its redelivery is a replay, never new work"
    ),
    "worker-fault": (
        "a worker killed or paused mid-run never applies an effect twice: the takeover's fence "
        "or reconciliation decides"
    ),
    "quarantine": (
        "a delivery the rules cannot decode with confidence is quarantined with its reason, "
        "never guessed, dropped or fatal to the consumer"
    ),
    "nothing-silent": (
        "a long-lived loop that fails is logged, counted and restarted with backoff, and "
        "readiness says so"
    ),
    "live-migration": (
        "a migration beside working bridges gives way when it cannot get its locks and "
        "applies all or nothing"
    ),
    "held-extension": (
        "a held delivery's visibility or ack deadline is extended while its row makes progress "
        "and settled once"
    ),
    "identity-key": (
        "a process with another identity key than the deployment's refuses to hash or write, "
        "and no process records a first key by accident"
    ),
    "database-fault-exit": (
        "every command meets an unusable database with one line naming the cause and the URL "
        "without its password, and its documented exit code"
    ),
}


def rendered() -> str:
    """The docs' table of promises (docs/operations.md, between the markers)."""
    lines = ["| id | promise |", "| --- | --- |"]
    lines += [f"| `{pid}` | {text} |" for pid, text in PROMISES.items()]
    return "\n".join(lines)
