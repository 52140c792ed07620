"""The ``fencebridge`` command line: argparse wiring over :mod:`bridge.commands`, one module
per command.

Settings come from flags or from ``FENCEBRIDGE_*`` environment variables; secrets (the
database URL) only from the environment or a flag, never from the subscription file.
Exit codes: 0 success, 1 a fencebridge error the message explains (for ``check``: a no-go;
for ``purge``: another purge was running), 2 bad usage, 130 interrupted, 141 the reader of
the output went away (``fencebridge status --json | head -1``), as a process killed by
SIGPIPE would report it.

The operator commands (status, inspect, redrive, resolve, rate-wait, sweep, purge, erase,
check) never print payload bytes. Tenants and operations are shown as keyed hashes
(``FENCEBRIDGE_IDENTITY_KEY``), the same ones logs and spans carry; only ``inspect``, given the
raw identifiers by the operator, echoes them back.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from bridge.commands import (
    check,
    config,
    console,
    demo,
    erase,
    identity,
    inspect,
    migrate,
    purge,
    rate_wait,
    redrive,
    resolve,
    run,
    shadow,
    status,
    sweep,
)
from bridge.commands.arguments import UsageError
from bridge.errors import FenceBridgeError
from bridge.telemetry.logs import configure_logging

if TYPE_CHECKING:
    from bridge.commands.arguments import Subcommands

Command = Callable[[argparse.Namespace], int]

#: every command, in the order ``--help`` lists them: a new command is a module in
#: :mod:`bridge.commands` and its ``register`` here
COMMANDS: tuple[Callable[[Subcommands], None], ...] = (
    migrate.register,
    run.register,
    demo.register,
    status.register,
    inspect.register,
    redrive.register,
    resolve.register,
    rate_wait.register,
    sweep.register,
    purge.register,
    erase.register,
    shadow.register,
    check.register,
    identity.register,
    config.register,
    console.register,
)

EXIT_CLOSED_PIPE = 128 + 13  # SIGPIPE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fencebridge",
        description="Broker deliveries become fenced work rows in PostgreSQL.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in COMMANDS:
        register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging()
    command: Command = args.run
    try:
        code = command(args)
        sys.stdout.flush()  # a closed pipe is found here, not at exit where it cannot be caught
    except BrokenPipeError:
        # The reader closed the pipe: what is left is for nobody. Point stdout at /dev/null so
        # that the interpreter's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_PIPE
    except UsageError as exc:
        parser.error(f"{args.command}: {exc}")
    except FenceBridgeError as exc:
        print(f"fencebridge {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code
