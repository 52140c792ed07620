"""``fencebridge check``: the nine go/no-go controls per job type; one no-go is a no-go.

``--probe`` runs the evidence of controls 3, 4 and 8 (:mod:`bridge.operator.probe`) in a scratch
schema it creates and drops; without it those controls answer from what they read, and a go among
them is shown as ``not probed`` (a warning: the exit code is that of a go).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bridge.commands.arguments import add_database_flag, usage
from bridge.commands.session import table
from bridge.database import connect, database_url

if TYPE_CHECKING:
    from bridge.commands.arguments import Subcommands
    from bridge.operator.check import Report


def register(commands: Subcommands) -> None:
    p = commands.add_parser(
        "check",
        help="the nine go/no-go controls per job type; exits 1 on any no-go",
        description="All required, never a score: one no-go makes the answer no-go.",
    )
    p.add_argument("--config", required=True, help="the bridge's TOML configuration file")
    p.add_argument(
        "--probe",
        action="store_true",
        help="run the evidence of controls 3, 4 and 8 (concurrent claims, a stale-fence write, "
        "a failed inbox commit per adapter) in a scratch schema it creates and drops; needs "
        "CREATE on the database",
    )
    p.add_argument(
        "--job-type",
        action="append",
        help="evaluate only this job type (repeatable): the gate of a cut-over, one job type "
        "moved from a shadow subscription to a live one",
    )
    add_database_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bridge.config import load_config
    from bridge.errors import ConfigError
    from bridge.operator import probe
    from bridge.operator.brokers import inspect_brokers
    from bridge.operator.check import evaluate, read_database
    from bridge.store.reach import READ_GRANTS, reach

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        problems = str(exc).splitlines()
        print(f"NO-GO: the configuration is refused ({len(problems)} problem(s)):")
        print("\n".join(f"  {line}" for line in problems))
        return 1
    wanted: list[str] | None = args.job_type
    unknown = [j for j in wanted or () if j not in config.jobs]
    if unknown:
        raise usage(f"no job type {', '.join(map(repr, unknown))} in {args.config}")
    url = database_url(args.database_url)
    reach(url, READ_GRANTS)
    with connect(url) as conn:
        facts = read_database(conn)
    probed = probe.run(url, config) if args.probe else None
    report = evaluate(config, facts, probed, job_types=wanted, brokers=inspect_brokers(config))
    print("\n".join(_check_lines(report)))
    shadow_only = sorted(
        job
        for job in wanted or config.jobs
        if not any(job in s.job_types for s in config.subscriptions.values() if not s.shadow)
        and any(job in s.job_types for s in config.subscriptions.values() if s.shadow)
    )
    if shadow_only:
        print(f"shadow only (recorded, never run): {', '.join(shadow_only)}")
    return 0 if report.go else 1


def _check_lines(report: Report) -> list[str]:
    rows = [
        [
            f.job_type,
            f.control.number,
            f.control.title,
            _state(f.verdict.go, f.verdict.executed),
            f.verdict.evidence,
        ]
        for f in report.findings
    ]
    lines = table(["job type", "#", "control", "verdict", "evidence"], rows)
    jobs = sorted({f.job_type for f in report.findings})
    unprobed = sorted({f.control.number for f in report.not_probed})
    if unprobed:
        which = ", ".join(str(n) for n in unprobed)
        lines.append(
            f"not probed: control(s) {which} answered from what they read; "
            "`fencebridge check --probe` runs their evidence"
        )
    warnings = sorted({w for f in report.findings for w in f.verdict.warnings})
    lines.extend(f"warning: {w}" for w in warnings)
    if report.go:
        lines.append(f"GO for {len(jobs)} job type(s): {_headline(report)}")
    else:
        failed: dict[str, list[str]] = {}
        for f in report.no_go:
            failed.setdefault(f.job_type, []).append(str(f.control.number))
        which = "; ".join(f"{j}: {', '.join(n)}" for j, n in failed.items())
        lines.append(f"NO-GO: {len(report.no_go)} control(s) fail ({which})")
    return lines


def _headline(report: Report) -> str:
    """What was executed, counted: a control holds when every job type's evidence of it ran and
    held; "all 9 controls hold" only then, never over a control that was not probed."""
    unprobed = sorted({f.control.number for f in report.not_probed})
    held = 9 - len(unprobed)
    warned = len({w for f in report.findings for w in f.verdict.warnings})
    text = "all 9 controls hold" if not unprobed else f"{held} held, {len(unprobed)} not probed"
    if unprobed:
        text += f" (control(s) {', '.join(map(str, unprobed))})"
    if warned:
        text += f"; {warned} warning(s)"
    return text


def _state(go: bool, executed: bool) -> str:
    """The verdict column: ``not probed`` is a go whose evidence did not run (a warning)."""
    if not go:
        return "NO-GO"
    return "go" if executed else "not probed"
