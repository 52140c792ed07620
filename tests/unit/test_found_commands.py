"""Commands from outside the core, found by entry point (``fencebridge.commands``): the demo's,
offered by ``fencebridge`` though no module of the core imports it, and never loaded for one of
the core's own commands; a command that cannot be loaded takes no other command down."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bridge.cli import COMMAND_ENTRY_POINTS, build_parser, main


def test_the_demo_command_is_found_by_its_entry_point() -> None:
    args = build_parser(["demo", "--keep"]).parse_args(["demo", "--keep", "--broker", "pubsub"])
    assert args.run.__module__ == "bridge.demo.command"
    assert (args.keep, args.broker) == (True, "pubsub")
    assert "demo" in build_parser([]).format_help()


@pytest.mark.slow
def test_the_core_commands_load_nothing_of_the_demo() -> None:
    """In a fresh interpreter: the parser of ``fencebridge run``, and the runtime it starts."""
    probe = (
        "import sys\n"
        "from bridge.cli import build_parser\n"
        "import bridge.runtime.process\n"
        "build_parser(['run', '--config', 'bridge.toml']).parse_args(['run', '--config', 'x'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('bridge.demo')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


def test_a_command_that_cannot_be_loaded_says_why_and_the_others_still_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    info = tmp_path / "broken_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[{COMMAND_ENTRY_POINTS}]\nbroken = no_such_package.command:register\n"
        "status = no_such_package.command:register\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    assert "unavailable: cannot be loaded from no_such_package.command:register" in (
        build_parser([]).format_help().replace("\n", " ").replace("  ", "")
    )
    assert main(["broken"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "fencebridge broken: cannot be loaded from no_such_package.command:register "
        "(ModuleNotFoundError: No module named 'no_such_package'); reinstall the package that "
        "provides it"
    )
    # the core's own `status` keeps its name; the demo is still offered
    everything = build_parser([])
    assert everything.parse_args(["status"]).run.__module__ == "bridge.commands.status"
    assert "demo" in build_parser(["broken"]).format_help()
