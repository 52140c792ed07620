"""Every error fencebridge raises, grouped by what the caller can do next.

::

    FenceBridgeError              never raised itself
    ├── ConfigError               fix the configuration; raised at start-up, names file and key
    │   ├── IdentityKeysOutdated  restart with the current identity key; nothing was written
    │   ├── IdentityKeyMismatch   the process's identity keys are not the database's
    │   ├── IdentityKeyMissing    a row was written under a key this process does not hold
    │   ├── IdentityKeyUnrecorded no key is recorded: `fencebridge identity init` records it
    │   └── EffectLogError        the shadow report's effect log cannot be read as documented
    ├── LeaseLost                 stop this work now; never retry the write that raised it
    │   └── FencedOut             the target itself refused a write carrying a stale fence
    ├── RelayLost                 stop relaying this destination: another relay holds its lease
    ├── TransientError            retry later with backoff; nothing was decided
    │   ├── StoreUnavailable      the database could not be reached, or the connection broke
    │   │   └── DatabaseUnreachable  a command's first connection failed (exit 3)
    │   ├── BrokerUnavailable     the broker could not be reached
    │   ├── SinkUnavailable       an outbox sink's send call failed as a whole; sent again later
    │   └── DeadlineExceeded      a class A handler ran past its deadline; rolled back, retried
    ├── StoreError                the database answered, but not as the schema expects
    │   ├── MigrationError        the schema cannot be brought to the version this code needs
    │   │   └── SchemaNotCurrent  the schema is missing, older or newer than this code (exit 4)
    │   ├── MissingGrants         the role lacks a privilege the command needs (exit 5)
    │   └── ErasureRefused        an erasure changed nothing; what blocks it is in the message
    ├── BrokerError               the broker refused the request for a reason retrying won't fix
    └── ProducerError             a message the rules would not decode or a broker would refuse
                                  (also a ValueError)

Every class is defined here, and ``tests/unit/test_errors.py`` holds this drawing to the
classes. A broken connection during COMMIT leaves the outcome of that transaction unknown to the
client. :class:`StoreUnavailable` says so in ``outcome_unknown``; every write in the store is
either idempotent (ingest) or fenced (claim and settlement), so the safe reaction is the same
either way: do not ack, do not repeat a fenced write under the same fence, let the lease and
redelivery run their course.
"""

from __future__ import annotations

from datetime import timedelta


class FenceBridgeError(Exception):
    """Root of fencebridge's errors."""

    #: the exit code of a command that ends on this error (documented in :mod:`bridge.cli`)
    exit_code = 1


class ConfigError(FenceBridgeError):
    """The configuration is invalid; the message names the file, the key and the problem."""


class IdentityKeysOutdated(ConfigError):  # noqa: N818  (a condition, named for what it found)
    """The inbox wrote nothing: an erasure since this process started hashed its tombstones
    under none of the identity keys it holds (a key rotation it has not been restarted for), so
    it could not tell a redelivery of what was erased from new work. Restart it with the current
    key; the broker hands the batch over again meanwhile."""


class IdentityKeyMismatch(ConfigError):  # noqa: N818  (a condition, named for what it found)
    """The process's identity keys are not the ones the database was written under."""


class IdentityKeyMissing(ConfigError):  # noqa: N818  (a condition, named for what is missing)
    """A row was written under a key this process does not hold."""


class IdentityKeyUnrecorded(ConfigError):  # noqa: N818  (a condition, named for what is missing)
    """No identity key is recorded in the database: the deployment's key is recorded on purpose
    (``fencebridge identity init``), never by whichever process starts first."""


class EffectLogError(ConfigError):
    """The effect log cannot be read as documented (a missing column, a bad value)."""


class LeaseLost(FenceBridgeError):  # noqa: N818  (a condition, not a failure of the caller)
    """The fence is no longer current: another claim or a settlement has moved the row on.

    The write that raised this changed nothing. The caller must stop working on the row and
    must never retry the write: a newer holder, or a terminal state, owns the row now.
    """

    def __init__(self, tenant_id: str, operation_id: str, fence: int, action: str) -> None:
        self.tenant_id = tenant_id
        self.operation_id = operation_id
        self.fence = fence
        self.action = action
        # Identifiers stay out of the message: messages end up in logs.
        super().__init__(f"{action} rejected: fence {fence} is no longer current")


class FencedOut(LeaseLost):
    """A class B target refused the write: it has already seen a higher fence.

    The write changed nothing at the target; a newer claim owns the operation. Never retried.
    """


class RelayLost(FenceBridgeError):  # noqa: N818  (a condition, like LeaseLost)
    """The destination's relay lease moved on: this relay's marks are refused."""


class TransientError(FenceBridgeError):
    """A dependency is unavailable; the same call may succeed later."""


class StoreUnavailable(TransientError):  # noqa: N818
    """The database could not be reached or the connection broke mid-call.

    ``outcome_unknown`` is true when the connection broke after the statement or COMMIT was
    sent: the write may or may not have happened.
    """

    def __init__(self, message: str, *, outcome_unknown: bool = False) -> None:
        self.outcome_unknown = outcome_unknown
        super().__init__(message)


class DatabaseUnreachable(StoreUnavailable):
    """A command's first connection failed: the server is unreachable, the database does not
    exist, or the server refused the login. The message names the URL without its password."""

    exit_code = 3


class BrokerUnavailable(TransientError):  # noqa: N818
    """The broker could not be reached."""


class SinkUnavailable(TransientError):  # noqa: N818  (a condition of the sink's service)
    """A send call failed as a whole (connection refused or cut, throttled, a 5xx): retried."""


class DeadlineExceeded(TransientError):  # noqa: N818  (a condition, like LeaseLost)
    """A class A transaction outlived its deadline and was rolled back: nothing was applied."""

    def __init__(self, deadline: timedelta) -> None:
        self.deadline = deadline
        super().__init__(
            f"the transaction ran past its deadline of {deadline.total_seconds():g}s and was "
            "rolled back; nothing was applied"
        )


class StoreError(FenceBridgeError):
    """The database answered in a way the store does not expect (schema missing, bad input)."""


class MigrationError(StoreError):
    """The schema cannot be brought to the version this code needs."""


class SchemaNotCurrent(MigrationError):  # noqa: N818  (a condition, named for what it found)
    """The database has no fencebridge schema, or one older or newer than this code."""

    exit_code = 4


class MissingGrants(StoreError):  # noqa: N818  (a condition, named for what is missing)
    """The role the command connected as lacks a privilege it needs (a table a migration added
    before the grants were applied again, or the wrong role for the command)."""

    exit_code = 5


class ErasureRefused(StoreError):  # noqa: N818  (a condition, named for what happened)
    """An erasure changed nothing: rows in its scope are still running or waiting to run, or
    were written while it ran."""


class BrokerError(FenceBridgeError):
    """The broker refused a request for a reason that retrying will not fix."""


class ProducerError(FenceBridgeError, ValueError):
    """A message the subscription's rules would not decode, or a broker would refuse."""
