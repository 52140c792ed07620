"""``fencebridge console``: the operator console's JSON API and its HTML pages on a local port.

Refuses to start without tokens, and before serving compares the identity key with the
database's, so no hash is ever shown under the wrong key.
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
    from bridge.commands.arguments import Subcommands


def register(commands: Subcommands) -> None:
    from bridge.console.auth import TOKENS_ENV, TOKENS_FILE_ENV  # noqa: PLC0415
    from bridge.console.server import DEFAULT_HOST, DEFAULT_PORT  # noqa: PLC0415

    p = commands.add_parser(
        "console",
        help="serve the operator console: JSON API and HTML pages (tokens, audited redrive)",
        description=(
            f"Tokens: ${TOKENS_ENV} (name:role:token,...) or ${TOKENS_FILE_ENV} (one a line); "
            f"roles viewer and operator. The API takes the token as a bearer token; the pages "
            f"(/login) take it once and keep a session. {KEY_NOTE}"
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
    from bridge.config import load_config  # noqa: PLC0415
    from bridge.console.api import ConsoleApi  # noqa: PLC0415
    from bridge.console.auth import Tokens  # noqa: PLC0415
    from bridge.console.server import ConsoleServer  # noqa: PLC0415

    tokens = Tokens.from_env()  # refuse before touching the database: no anonymous console
    config = load_config(args.config)
    hasher = identity_hasher()
    with open_store(args) as store:
        keyed(store, hasher)
        server = ConsoleServer(ConsoleApi(store, config, hasher), tokens, args.host, args.port)
        stop = threading.Event()

        def _on_signal(_signum: int, _frame: FrameType | None) -> None:
            stop.set()

        previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            server.start()
            print(f"fencebridge console: http://{args.host}:{server.port}/api/v1/", flush=True)
            print(f"console pages: http://{args.host}:{server.port}/login", flush=True)
            stop.wait()
        finally:
            server.stop()
            for s, handler in previous.items():
                signal.signal(s, handler)
    return 0
