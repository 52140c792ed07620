"""``fencebridge check``: the nine go/no-go controls per job type; one no-go is a no-go."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bridge.commands.arguments import add_database_flag
from bridge.commands.session import table
from bridge.database import connect, database_url

if TYPE_CHECKING:
    from bridge.check import Report
    from bridge.commands.arguments import Subcommands


def register(commands: Subcommands) -> None:
    p = commands.add_parser(
        "check",
        help="the nine go/no-go controls per job type; exits 1 on any no-go",
        description="All required, never a score: one no-go makes the answer no-go.",
    )
    p.add_argument("--config", required=True, help="the bridge's TOML configuration file")
    add_database_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bridge.check import evaluate, read_database  # noqa: PLC0415
    from bridge.config import load_config  # noqa: PLC0415
    from bridge.errors import ConfigError  # noqa: PLC0415

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        problems = str(exc).splitlines()
        print(f"NO-GO: the configuration is refused ({len(problems)} problem(s)):")
        print("\n".join(f"  {line}" for line in problems))
        return 1
    with connect(database_url(args.database_url)) as conn:
        facts = read_database(conn)
    report = evaluate(config, facts)
    print("\n".join(_check_lines(report)))
    return 0 if report.go else 1


def _check_lines(report: Report) -> list[str]:
    rows = [
        [
            f.job_type,
            f.control.number,
            f.control.title,
            "go" if f.verdict.go else "NO-GO",
            f.verdict.evidence,
        ]
        for f in report.findings
    ]
    lines = table(["job type", "#", "control", "verdict", "evidence"], rows)
    jobs = sorted({f.job_type for f in report.findings})
    if report.go:
        lines.append(f"GO: all 9 controls hold for {len(jobs)} job type(s)")
    else:
        failed: dict[str, list[str]] = {}
        for f in report.no_go:
            failed.setdefault(f.job_type, []).append(str(f.control.number))
        which = "; ".join(f"{j}: {', '.join(n)}" for j, n in failed.items())
        lines.append(f"NO-GO: {len(report.no_go)} control(s) fail ({which})")
    return lines
