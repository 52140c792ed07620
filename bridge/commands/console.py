"""``fencebridge console``: the operator console's JSON API and its HTML pages on a local port.

Refuses to start without tokens, and before serving compares the identity key with the
database's, so no hash is ever shown under the wrong key. The go/no-go page runs
:func:`bridge.operator.check.evaluate` on a connection of its own, as ``fencebridge check`` does.
"""

from __future__ import annotations

import argparse
import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING

from bridge.commands.arguments import KEY_NOTE, add_database_flag, positive
from bridge.commands.session import identity_hasher, keyed, open_store

if TYPE_CHECKING:
    from collections.abc import Callable

    from bridge.commands.arguments import Subcommands
    from bridge.config import BridgeConfig
    from bridge.operator.check import Report


def register(commands: Subcommands) -> None:
    from bridge.console.auth import (
        PROXY_HEADER_ENV,
        TOKENS_ENV,
        TOKENS_FILE_ENV,
        TRUSTED_PROXIES_ENV,
    )
    from bridge.console.server import DEFAULT_HOST, DEFAULT_PORT

    p = commands.add_parser(
        "console",
        help="serve the operator console: JSON API and HTML pages (tokens, audited redrive)",
        description=(
            f"Tokens: ${TOKENS_ENV} (name:role:token,...) or ${TOKENS_FILE_ENV} (one a line); "
            f"roles viewer, operator and payload (a viewer who may read one operation's payload, "
            f"each view audited). The API takes the token as a bearer token; the pages (/login) "
            f"take it once and keep a session. Behind an authenticating proxy, "
            f"${PROXY_HEADER_ENV} names the header with its user (trusted only from loopback "
            f"or ${TRUSTED_PROXIES_ENV}). {KEY_NOTE}"
        ),
    )
    p.add_argument(
        "--config", required=True, help="the bridge's TOML configuration (redrive lookups)"
    )
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    p.add_argument(
        "--port", type=positive, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})"
    )
    add_database_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bridge.config import load_config
    from bridge.console.api import ConsoleApi
    from bridge.console.auth import ProxyAuth, Tokens
    from bridge.console.server import ConsoleServer, describe
    from bridge.database import database_url
    from bridge.store.reach import CONSOLE_GRANTS

    tokens = Tokens.from_env()  # refuse before touching the database: no anonymous console
    proxy = ProxyAuth.from_env(None, host=args.host)
    config = load_config(args.config)
    hasher = identity_hasher()
    with open_store(args, grants=CONSOLE_GRANTS) as store:
        keyed(store, hasher)
        checks = _checks(config, database_url(args.database_url))
        api = ConsoleApi(store, config, hasher, checks=checks)
        server = ConsoleServer(api, tokens, args.host, args.port, proxy=proxy)
        stop = threading.Event()

        def _on_signal(_signum: int, _frame: FrameType | None) -> None:
            stop.set()

        previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            server.start()
            base = describe(args.host, server.port)
            print(f"fencebridge console: {base}/api/v1/", flush=True)
            print(f"console pages: {base}/login", flush=True)
            stop.wait()
        finally:
            server.stop()
            for s, handler in previous.items():
                signal.signal(s, handler)
    return 0


def _checks(config: BridgeConfig, url: str) -> Callable[[], Report]:
    """The go/no-go report, read afresh on a connection of its own each time it is asked for."""

    def report() -> Report:
        from bridge.database import connect
        from bridge.operator.check import evaluate, read_database

        with connect(url) as conn:
            facts = read_database(conn)
        return evaluate(config, facts)

    return report
