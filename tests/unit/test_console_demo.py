"""What ``fencebridge demo --keep`` prints about the console: commands a shell runs as they
are, ending in ``fencebridge console`` on the demo's configuration with a token it accepts."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from bridge.cli import build_parser
from bridge.console.auth import Role, Tokens
from bridge.demo.explore import Workspace, console_commands, lines


def test_the_kept_demo_prints_how_to_start_the_console(tmp_path: Path) -> None:
    space = Workspace(tmp_path / "demo run", owned=False)
    printed = lines(space, [("database", "postgresql://127.0.0.1:5432/demo")])

    start = printed.index("try, from another shell:")
    console = next(i for i, line in enumerate(printed) if line.startswith("the console"))
    assert console > start
    commands = [line.strip() for line in printed[console + 1 :]]
    assert commands == console_commands(str(space.directory))
    assert commands[0] == f". {shlex.quote(str(space.env))}"
    (run,) = [c for c in commands if c.startswith("fencebridge console")]
    args = build_parser().parse_args(shlex.split(run)[1:])
    assert (args.command, args.config) == ("console", str(space.config))


def test_the_token_line_gives_a_token_the_console_accepts() -> None:
    (export,) = [c for c in console_commands("demo-run") if c.startswith("export ")]
    shown = subprocess.run(
        ["bash", "-c", f'{export}\nprintf %s "$FENCEBRIDGE_CONSOLE_TOKENS"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    name, role, token = shown.split(":")
    assert Tokens.parse(shown).authenticate(token) is not None
    assert (name, Role(role)) == ("you", Role.OPERATOR)
