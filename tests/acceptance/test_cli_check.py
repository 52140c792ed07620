"""``fencebridge check`` as an operator runs it: the nine controls per job type, all required.

Each configuration below differs from a passing one in one respect, and the check must answer
no-go for exactly the job type and the control that respect belongs to, with its evidence, and
exit 1. The handlers are real classes the CLI process imports and builds, as `run` does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bridge.database import DATABASE_URL_ENV, Connection
from bridge.handlers import (
    Applied,
    CannotTell,
    Context,
    IdempotentApiHandler,
    NotApplied,
    SameDatabaseHandler,
    Success,
    UnfencedHandler,
)
from tests.support.postgres import create_database, drop_database, unique_name

ROOT = Path(__file__).resolve().parents[2]
HERE = "tests.acceptance.test_cli_check"
ROW = re.compile(r"^(\S+)\s+(\d)\s+(.+?)\s{2,}(go|NO-GO|not probed)\s{2,}(.*)$")


class Charge(IdempotentApiHandler):
    def perform(self, ctx: Context, key: str) -> Success:
        return Success("charged", key)

    def lookup(self, ctx: Context, key: str) -> Applied | NotApplied:
        if not ctx.payload:
            raise CannotTell("no payload")
        return NotApplied() if ctx.attempt < 2 else Applied("charged", key)


class ChargeWithoutLookup(IdempotentApiHandler):  # lookup left abstract on purpose
    def perform(self, ctx: Context, key: str) -> Success:
        return Success("charged", key)


class ChargeWithPlaceholderLookup(IdempotentApiHandler):
    def perform(self, ctx: Context, key: str) -> Success:
        return Success("charged", key)

    def lookup(self, ctx: Context, key: str) -> Applied | NotApplied:
        """To do: ask the provider."""
        raise NotImplementedError


class Ledger(SameDatabaseHandler):
    def handle(self, ctx: Context, tx: Connection) -> None:
        tx.execute("SELECT 1")


class Sms(UnfencedHandler):
    def call(self, ctx: Context) -> None:
        return None


class ChargeWithClient(Charge):
    """Needs its client handed in: the configuration cannot build it."""

    def __init__(self, client: object) -> None:
        self.client = client


def charge_factory() -> Charge:
    return Charge()


CHARGE_INSTANCE = Charge()
NOT_A_HANDLER = {"perform": "not a handler"}


class ChargeWithoutKey(IdempotentApiHandler):
    def perform(self, ctx: Context) -> Success:  # type: ignore[override]
        return Success("charged")

    def lookup(self, ctx: Context, key: str) -> Applied | NotApplied:
        return NotApplied()


def broken_factory() -> Charge:
    raise RuntimeError("PAYMENTS_API_TOKEN is not set")


JOBS = {
    "charge": f'handler = "{HERE}:Charge"\ntarget_class = "C"\nowner = "payments"',
    "ledger": f'handler = "{HERE}:Ledger"\ntarget_class = "A"\nowner = "ledger"',
    "sms": f'handler = "{HERE}:Sms"\ntarget_class = "D"\nowner = "messaging"',
}
RETENTION = '[retention]\npurge_after_days = 30\nerasure_owner = "privacy-office"'


def config(*, jobs: dict[str, str] | None = None, retention: str | None = RETENTION) -> str:
    jobs = {**JOBS, **(jobs or {})}
    parts = [f"[jobs.{name}]\n{body}" for name, body in jobs.items()]
    parts.append(
        "[subscriptions.orders]\n"
        'source = "sqs"\n'
        'queue_url = "http://127.0.0.1:9/queue/orders"\n'
        f"job_types = [{', '.join(repr(j).replace(chr(39), chr(34)) for j in jobs)}]\n"
        "[subscriptions.orders.decode]\n"
        'tenant_id = "attribute:tenant"\n'
        'operation_id = "body:/id"\n'
        'job_type = "attribute:type"\n'
        'payload = "body:/data"'
    )
    if retention is not None:
        parts.append(retention)
    return "\n\n".join(parts) + "\n"


@pytest.fixture
def check(tmp_path: Path, db_url: str) -> Any:
    def run(
        text: str, url: str = db_url, *flags: str
    ) -> tuple[int, dict[tuple[str, int], tuple[bool, str]], str]:
        path = tmp_path / "bridge.toml"
        path.write_text(text)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEBRIDGE_", "PG"))}
        env[DATABASE_URL_ENV] = url
        done = subprocess.run(
            [sys.executable, "-m", "bridge", "check", "--config", str(path), *flags],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert "Traceback" not in done.stderr, done.stderr
        rows = {}
        for line in done.stdout.splitlines():
            match = ROW.match(line)
            if match:
                # "not probed" is a go whose evidence did not run: its evidence says so
                rows[(match[1], int(match[2]))] = (match[4] != "NO-GO", match[5])
        return done.returncode, rows, done.stdout

    return run


def no_go(rows: dict[tuple[str, int], tuple[bool, str]]) -> set[tuple[str, int]]:
    return {key for key, (go, _) in rows.items() if not go}


def verdict_column(out: str) -> dict[tuple[str, int], str]:
    return {(m[1], int(m[2])): m[4] for m in (ROW.match(line) for line in out.splitlines()) if m}


@pytest.mark.slow
def test_a_complete_configuration_is_go_on_every_control(check: Any) -> None:
    code, rows, out = check(config())
    assert code == 0, out
    assert set(rows) == {(job, n) for job in JOBS for n in range(1, 10)}
    assert no_go(rows) == set()
    # the headline counts what ran: never "all 9 hold" over a control that was not probed
    assert out.splitlines()[-1] == (
        "GO for 3 job type(s): 6 held, 3 not probed (control(s) 3, 4, 8)"
    )
    assert "all 9" not in out
    # without --probe, the controls whose evidence must run say that it did not
    column = verdict_column(out)
    assert {key for key, state in column.items() if state == "not probed"} == {
        (job, n) for job in JOBS for n in (3, 4, 8)
    }
    assert "not probed (`fencebridge check --probe` runs its evidence)" in rows[("sms", 8)][1]
    assert "acknowledged only after" not in rows[("sms", 8)][1]
    assert out.splitlines()[-2] == (
        "not probed: control(s) 3, 4, 8 answered from what they read; "
        "`fencebridge check --probe` runs their evidence"
    )


@pytest.mark.slow
def test_check_probe_runs_the_evidence_of_controls_3_4_and_8(
    check: Any, db_url: str, db: Connection
) -> None:
    code, rows, out = check(config(), db_url, "--probe")
    assert code == 0, out
    assert no_go(rows) == set()
    # control 8's queue (nothing listens on its port) could not be asked: that much was not
    # probed, and the headline says so; every other control's evidence ran
    assert {k for k, v in verdict_column(out).items() if v != "go"} == {(j, 8) for j in JOBS}
    assert "orders: broker not probed" in rows[("sms", 8)][1]
    assert out.splitlines()[-1] == "GO for 3 job type(s): 8 held, 1 not probed (control(s) 8)"
    for job in JOBS:
        assert "16 threads claimed 500 rows: 0 claimed twice" in rows[(job, 3)][1]
        assert "the stale settlement (fence 1) was refused" in rows[(job, 4)][1]
        assert (
            "probe: orders (sqs): inbox commit failed (StoreError) -> DeleteMessageBatch x0"
            in rows[(job, 8)][1]
        )
    schemas = db.execute(
        "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'fencebridge\\_probe\\_%'"
    ).fetchone()
    assert schemas == (0,)
    assert "primary key (tenant_id, operation_id)" in rows[("charge", 1)][1]
    assert "dedupe, not fencing" in rows[("charge", 5)][1]
    assert "Charge.lookup by idempotency key" in rows[("charge", 6)][1]
    assert "max_attempts = 1" in rows[("sms", 6)][1]
    assert "erasure owner privacy-office" in rows[("ledger", 9)][1]
    assert "tombstones kept 35 d" in rows[("ledger", 9)][1]  # the default horizon
    assert "audited by keyed hashes, tombstones kept" in rows[("ledger", 9)][1]


@pytest.mark.slow
def test_a_class_c_handler_without_a_lookup_is_no_go(check: Any) -> None:
    code, rows, out = check(
        config(jobs={"charge": JOBS["charge"].replace(":Charge", ":ChargeWithoutLookup")})
    )
    assert code == 1
    assert no_go(rows) == {("charge", 5), ("charge", 6)}
    assert "lookup abstract" in rows[("charge", 5)][1]
    assert "lookup is abstract" in rows[("charge", 6)][1]
    assert out.splitlines()[-1] == "NO-GO: 2 control(s) fail (charge: 5, 6)"


@pytest.mark.slow
def test_a_class_c_lookup_that_only_raises_not_implemented_is_no_go(check: Any) -> None:
    body = JOBS["charge"].replace(":Charge", ":ChargeWithPlaceholderLookup")
    code, rows, _ = check(config(jobs={"charge": body}))
    assert code == 1
    assert no_go(rows) == {("charge", 6)}
    assert "only raises NotImplementedError" in rows[("charge", 6)][1]


@pytest.mark.slow
def test_a_class_d_handler_allowed_a_second_attempt_is_no_go(check: Any) -> None:
    # Declared as class B (so the file loads), but the handler is unfenced, with three attempts.
    body = f'handler = "{HERE}:Sms"\ntarget_class = "B"\nmax_attempts = 3\nowner = "messaging"'
    code, rows, _ = check(config(jobs={"sms": body}))
    assert code == 1
    assert no_go(rows) == {("sms", 5), ("sms", 6)}
    assert "declared class B, but Sms is a class D handler" in rows[("sms", 5)][1]
    assert "max_attempts = 3" in rows[("sms", 6)][1]


@pytest.mark.slow
def test_a_class_d_job_with_two_attempts_is_refused_as_no_go(check: Any) -> None:
    body = JOBS["sms"] + "\nmax_attempts = 2"
    code, rows, out = check(config(jobs={"sms": body}))
    assert code == 1
    assert rows == {}
    lines = out.splitlines()
    assert lines[0] == "NO-GO: the configuration is refused (1 problem(s)):"
    assert lines[1].startswith("  ")
    assert "allows one attempt only" in lines[1]


@pytest.mark.slow
def test_an_owner_and_a_retention_plan_are_required(check: Any) -> None:
    code, rows, _ = check(
        config(jobs={"ledger": f'handler = "{HERE}:Ledger"\ntarget_class = "A"'}, retention=None)
    )
    assert code == 1
    assert no_go(rows) == {("ledger", 7), ("charge", 9), ("ledger", 9), ("sms", 9)}
    assert "no owner" in rows[("ledger", 7)][1]
    assert "no [retention] table" in rows[("sms", 9)][1]


@pytest.mark.slow
def test_purging_within_the_redelivery_window_is_no_go(check: Any) -> None:
    short = RETENTION.replace("30", "7")
    code, rows, _ = check(config(retention=short))
    assert code == 1
    assert no_go(rows) == {("charge", 9), ("ledger", 9), ("sms", 9)}
    assert "within orders's redelivery window (sqs: up to 14 d)" in rows[("sms", 9)][1]


@pytest.mark.slow
def test_a_tombstone_horizon_within_the_redelivery_window_is_no_go(check: Any) -> None:
    code, rows, _ = check(config(retention=RETENTION + "\ntombstone_days = 14"))
    assert code == 1
    assert no_go(rows) == {("charge", 9), ("ledger", 9), ("sms", 9)}
    assert rows[("sms", 9)][1] == (
        "tombstones kept 14 d, within orders's redelivery window (sqs: up to 14 d): a "
        "redelivery of an erased operation would run it again"
    )

    code, rows, _ = check(config(retention=RETENTION + "\ntombstone_days = 15"))
    assert code == 0
    assert "tombstones kept 15 d" in rows[("sms", 9)][1]


@pytest.mark.slow
def test_a_cut_over_is_gated_on_its_own_job_type(check: Any, db_url: str) -> None:
    """One job type moves from a shadow subscription to a live one: its controls alone decide,
    and another job type's no-go does not hold it back (nor does its go hide one)."""
    moved = config(
        jobs={"charge": JOBS["charge"].replace(":Charge", ":ChargeWithoutLookup")}
    ).replace('source = "sqs"', 'source = "sqs"\nmode = "shadow"')
    moved += (
        '\n[subscriptions.ledger_live]\nsource = "sqs"\n'
        'queue_url = "http://127.0.0.1:9/queue/ledger"\njob_types = ["ledger"]\n'
        '[subscriptions.ledger_live.decode]\ntenant_id = "attribute:tenant"\n'
        'operation_id = "body:/id"\njob_type = "value:ledger"\npayload = "body:/data"\n'
    )
    code, rows, out = check(moved)
    assert code == 1
    assert "shadow only (recorded, never run): charge, sms" in out

    code, rows, out = check(moved, db_url, "--job-type", "ledger")
    assert code == 0, out
    assert {job for job, _ in rows} == {"ledger"}
    assert out.splitlines()[-1] == (
        "GO for 1 job type(s): 6 held, 3 not probed (control(s) 3, 4, 8)"
    )

    code, rows, out = check(moved, db_url, "--job-type", "charge")
    assert code == 1
    assert no_go(rows) == {("charge", 5), ("charge", 6)}
    assert out.splitlines()[-1] == "shadow only (recorded, never run): charge"


@pytest.mark.slow
def test_an_unmigrated_database_is_no_go(check: Any, pg_admin_url: str) -> None:
    """A database without the schema ends the check as it ends every command (exit 4, one
    line on stderr naming the database): not a go, and no control is answered over it."""
    name = unique_name("fbt_check")
    url = create_database(pg_admin_url, name)
    try:
        code, rows, out = check(config(), url)
    finally:
        drop_database(pg_admin_url, name)
    assert code == 4
    assert rows == {}
    assert out == ""


def job(handler: str, target_class: str = "C") -> str:
    return f'handler = "{handler}"\ntarget_class = "{target_class}"\nowner = "payments"'


@pytest.mark.slow
def test_the_check_builds_each_handler_as_run_does_and_fails_those_it_cannot(
    check: Any,
) -> None:
    jobs = {
        "factory": job(f"{HERE}:charge_factory"),
        "instance": job(f"{HERE}:CHARGE_INSTANCE"),
        "needs_client": job(f"{HERE}:ChargeWithClient"),
        "broken_factory": job(f"{HERE}:broken_factory"),
        "no_module": job("payments_that_are_not_installed.handlers:Charge"),
        "no_attribute": job(f"{HERE}:NoSuchHandler"),
        "not_a_handler": job(f"{HERE}:NOT_A_HANDLER"),
        "wrong_shape": job(f"{HERE}:ChargeWithoutKey"),
    }
    code, rows, out = check(config(jobs=jobs))
    assert code == 1, out
    failed = {"needs_client", "broken_factory", "no_module", "no_attribute", "not_a_handler"}
    assert {j for j, _ in no_go(rows)} == failed | {"wrong_shape"}
    # A handler that cannot be built fails control 5, and 6 too when there is no class to judge
    # (a factory's, or nothing imported); every other control still answers.
    assert {n for j, n in no_go(rows) if j == "needs_client"} == {5}
    assert {n for j, n in no_go(rows) if j in {"broken_factory", "no_module"}} == {5, 6}
    assert "missing 1 required positional argument: 'client'" in rows[("needs_client", 5)][1]
    assert "called with no arguments" in rows[("needs_client", 5)][1]
    assert "PAYMENTS_API_TOKEN is not set" in rows[("broken_factory", 5)][1]
    assert "the factory is called with no arguments" in rows[("broken_factory", 5)][1]
    assert (
        "cannot import module 'payments_that_are_not_installed.handlers'"
        in (rows[("no_module", 5)][1])
    )
    assert "PYTHONPATH" in rows[("no_module", 5)][1]
    assert f"module {HERE!r} has no attribute 'NoSuchHandler'" in rows[("no_attribute", 5)][1]
    assert "is not a fencebridge handler: the object is a dict" in rows[("not_a_handler", 5)][1]
    assert ("not_a_handler", 6) in no_go(rows)
    assert (
        "ChargeWithoutKey.perform cannot be called as perform(ctx, key)"
        in (rows[("wrong_shape", 5)][1])
    )
    assert {n for j, n in no_go(rows) if j in {"factory", "instance"}} == set()
    assert "Charge extends IdempotentApiHandler" in rows[("factory", 5)][1]
    assert "Charge extends IdempotentApiHandler" in rows[("instance", 5)][1]


@pytest.mark.slow
def test_run_refuses_the_handler_check_refused_with_the_same_reason(
    check: Any, tmp_path: Path, db_url: str
) -> None:
    text = config(jobs={"needs_client": job(f"{HERE}:ChargeWithClient")})
    _, rows, _ = check(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEBRIDGE_", "PG"))}
    env[DATABASE_URL_ENV] = db_url
    env["FENCEBRIDGE_IDENTITY_KEY"] = "11" * 32
    done = subprocess.run(
        [sys.executable, "-m", "bridge", "run", "--config", str(tmp_path / "bridge.toml")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    reason = rows[("needs_client", 5)][1].removeprefix("`fencebridge run` cannot start it: ")
    assert f"fencebridge run: {reason}" in done.stderr
