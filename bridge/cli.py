"""The ``fencebridge`` command line: argparse wiring over :mod:`bridge.commands`, one module
per command.

Settings come from flags or from ``FENCEBRIDGE_*`` environment variables; secrets (the
database URL) only from the environment or a flag, never from the subscription file.
Exit codes: 0 success, 1 a fencebridge error the message explains (for ``check``: a no-go;
for ``purge``: another purge was running), 2 bad usage, 3 the database cannot be reached (the
server is down or unreachable, the database does not exist, the login is refused), 4 the
database has no fencebridge schema or one this release does not match (run ``fencebridge
migrate``), 5 the role lacks a grant the command needs, 130 interrupted, 141 the reader of the
output went away (``fencebridge status --json | head -1``), as a process killed by SIGPIPE
would report it. Codes 3 to 5 come with one line naming the cause and the database URL without
its password, the same for every command (:mod:`bridge.store.reach`).

The operator commands (status, inspect, redrive, resend, resolve, rate-wait, sweep, purge,
erase, check) never print payload bytes. Tenants and operations are shown as keyed hashes
(``FENCEBRIDGE_IDENTITY_KEY``), the same ones logs and spans carry; only ``inspect``, given the
raw identifiers by the operator, echoes them back.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Final

from bridge.commands import (
    check,
    config,
    console,
    erase,
    identity,
    inspect,
    migrate,
    purge,
    rate_wait,
    redrive,
    resend,
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

#: every command of the core, in the order ``--help`` lists them: a new command is a module in
#: :mod:`bridge.commands` and its ``register`` here
COMMANDS: tuple[Callable[[Subcommands], None], ...] = (
    migrate.register,
    run.register,
    status.register,
    inspect.register,
    redrive.register,
    resend.register,
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

#: commands from outside the core, listed after its own: each entry point names a
#: ``register(commands)``. The demo's is ``demo = "bridge.demo.command:register"``, so the
#: core never imports the demo to offer ``fencebridge demo``.
COMMAND_ENTRY_POINTS: Final = "fencebridge.commands"

EXIT_CLOSED_PIPE = 128 + 13  # SIGPIPE


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of ``argv``: the core's commands, and the commands found by entry point
    unless ``argv`` names one of the core's (so ``fencebridge run`` loads none of them)."""
    parser = argparse.ArgumentParser(
        prog="fencebridge",
        description="Broker deliveries become fenced work rows in PostgreSQL.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in COMMANDS:
        register(commands)
    if argv and argv[0] in commands.choices:
        return parser
    for found in sorted(entry_points(group=COMMAND_ENTRY_POINTS), key=lambda ep: ep.name):
        if found.name not in commands.choices:  # the core's own command keeps its name
            _add_found(commands, found)
    return parser


def _add_found(commands: Subcommands, found: EntryPoint) -> None:
    """Add a command found by entry point; one that cannot be loaded is still listed, and
    running it says why, so that a broken install never takes the other commands down."""
    try:
        register: Callable[[Subcommands], None] = found.load()
        register(commands)
    except Exception as exc:  # noqa: BLE001  (any failure of another package's import)
        problem = f"cannot be loaded from {found.value} ({type(exc).__name__}: {exc})"
        broken = commands.add_parser(found.name, help=f"(unavailable: {problem})")

        def unavailable(args: argparse.Namespace) -> int:
            raise FenceBridgeError(f"{problem}; reinstall the package that provides it")

        broken.set_defaults(run=unavailable)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(arguments)
    args = parser.parse_args(arguments)
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
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return code
