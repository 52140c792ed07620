"""``fencebridge run``: the bridge itself, until SIGTERM or SIGINT drains it."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bridge.commands.arguments import add_database_flag
from bridge.database import DATABASE_URL_ENV, database_url
from bridge.identity import IDENTITY_KEY_ENV

if TYPE_CHECKING:
    from bridge.commands.arguments import Subcommands


def register(commands: Subcommands) -> None:
    p = commands.add_parser(
        "run",
        help="run the bridge: consumers, worker pool, sweeper (SIGTERM/SIGINT drain and exit 0)",
        description=(
            f"Secrets come from the environment: ${DATABASE_URL_ENV} and ${IDENTITY_KEY_ENV} "
            "(the key of idempotency keys and of hashed identifiers in logs: the deployment's "
            "key, which the database checks; record it first with `fencebridge identity init`, "
            "change it only with `fencebridge identity rotate`)."
        ),
    )
    p.add_argument("--config", required=True, help="the bridge's TOML configuration file")
    add_database_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bridge.config import load_config
    from bridge.identity import IdentityHasher
    from bridge.runtime.collector import settle_in
    from bridge.runtime.process import open_bridge
    from bridge.store.reach import BRIDGE_GRANTS, reach
    from bridge.telemetry.setup import configure_telemetry

    config = load_config(args.config)
    hasher = IdentityHasher.from_env()
    url = database_url(args.database_url)
    reach(url, BRIDGE_GRANTS)  # one line and its exit code, never the pool's wait and traceback
    telemetry = configure_telemetry()  # an exporter it cannot honour stops the start here
    try:
        bridge = open_bridge(
            config,
            url,
            hasher,
            limits=config.bridge.limits(),
            record_first_key=False,  # `fencebridge identity init` records the deployment's key
        )
        if telemetry.metrics:
            bridge.telemetry.observe(
                bridge.store.operator,
                limits=config.concurrency_limits(),
                rates=config.token_rates(),
                outbox=bridge.store.outbox.depth if bridge.relay is not None else None,
                destinations=list(config.outbox),
                subscriptions=list(config.subscriptions),
            )
        settle_in()  # the collector leaves what the start made alone (bridge.runtime.collector)
        try:
            bridge.run_until_signalled()
        finally:
            bridge.telemetry.stop_observing()
            bridge.store.close()
    finally:
        telemetry.shutdown()
    return 0
