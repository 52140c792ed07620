"""fencebridge: broker deliveries become fenced work rows in PostgreSQL.

The core package: the work store and its protocol, executors, runtime, configuration,
telemetry and the command line. Broker adapters live in the sibling package ``consumers``,
which depends on this one, never the reverse.
"""

from bridge.errors import (
    BrokerError,
    BrokerUnavailable,
    ConfigError,
    FenceBridgeError,
    LeaseLost,
    MigrationError,
    StoreError,
    StoreUnavailable,
    TransientError,
)
from bridge.store import PostgresStore, Settlement
from bridge.types import (
    Claim,
    Decision,
    Delivery,
    IngestResult,
    Key,
    RedriveFilter,
    Rejection,
    State,
    Stats,
    TargetClass,
    Ticket,
)

__all__ = [
    "BrokerError",
    "BrokerUnavailable",
    "Claim",
    "ConfigError",
    "Decision",
    "Delivery",
    "FenceBridgeError",
    "IngestResult",
    "Key",
    "LeaseLost",
    "MigrationError",
    "PostgresStore",
    "RedriveFilter",
    "Rejection",
    "Settlement",
    "State",
    "Stats",
    "StoreError",
    "StoreUnavailable",
    "TargetClass",
    "Ticket",
    "TransientError",
]
