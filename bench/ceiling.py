"""What the server itself can do, measured in the same run as the systems compared with it.

* :func:`claim_settle_ceiling`: ``pgbench`` running the project's own claim (``claim_fair.sql``,
  the pool's, for 10 rows) and ``settle_many.sql`` for the rows it claimed, one transaction per
  pair, prepared, with no Python in the way: the most the pool's statements can do here.
* :func:`commit_ceiling`: ``pgbench`` committing single-row inserts: the most commits per
  second the server makes at that many clients (the end-to-end benchmark's ceiling).

``pgbench`` reads and writes through libpq in C, so these are ceilings for the statements, not
rates a Python process can reach; they say how far from the database's speed a system is.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass

import psycopg
from psycopg import conninfo

from bench.store import binary, prepare_queue
from bridge import sql
from bridge.database import GENERIC_PLANS
from bridge.store.work import ATTEMPT_HISTORY_DEFAULT

CEILING_BATCH = 10
#: the work rows' timestamps, read back by the database clock as for every system
PAIRS = """
SELECT claimed_at AS picked, settled_at AS settled FROM work_item WHERE state = 'succeeded'
"""
SPAN = f"""
WITH t AS ({PAIRS})
SELECT count(*), extract(epoch FROM max(settled) - min(picked)) FROM t
"""
COMMIT_TABLE = "CREATE TABLE IF NOT EXISTS bench_commit (id bigserial, at timestamptz)"
COMMIT_SCRIPT = "INSERT INTO bench_commit (at) VALUES (now());\n"


@dataclass(frozen=True)
class Rate:
    rows: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def _pgbench_env(url: str) -> tuple[list[str], str]:
    """Connection options for pgbench from a URL (pgbench takes the database name alone)."""
    params = conninfo.conninfo_to_dict(url)
    args = []
    if params.get("host"):
        args += ["-h", str(params["host"])]
    if params.get("port"):
        args += ["-p", str(params["port"])]
    if params.get("user"):
        args += ["-U", str(params["user"])]
    return args, str(params.get("dbname", "postgres"))


def _strip(text: str) -> str:
    lines = (line for line in text.splitlines() if not line.lstrip().startswith("--"))
    return " ".join(" ".join(lines).split())


def claim_settle_script() -> str:
    """One pgbench transaction: the tenant-fair claim the pool runs (claim_fair.sql, its limit
    in its text) for 10 rows, settle_many.sql for what it claimed. Run prepared (``-M
    prepared``), as the pool's statements run: planned once, the claimed keys bound as
    parameters."""
    claim = _strip(sql.with_limit("claim_fair", CEILING_BATCH))
    for name, value in {
        "now": "NULL",
        "job_types": "NULL",
        "worker": "'pgbench'",
        "lease": "'5 minutes'",
        "identity_keys": "NULL",  # any identity key, as a process holding every key claims
        "history": str(ATTEMPT_HISTORY_DEFAULT),
        "after": "''",  # every claim walks from the first tenant: one tenant here
        "weights": "NULL",
    }.items():
        claim = claim.replace(f"%({name})s", value)
    settle = _strip(sql.statement("settle_many"))
    count = "ARRAY[cardinality(:f::bigint[])]"
    for name, value in {
        "now": "NULL",
        "tenant_id": ":t",
        "operation_id": ":o",
        "fence": ":f",
        "state": f"array_fill('succeeded'::text, {count})",
        "outcome_code": f"array_fill('ok'::text, {count})",
        "outcome_detail": f"array_fill(NULL::text, {count})",
        "error_class": f"array_fill(NULL::text, {count})",
        "finding": f"array_fill(NULL::text, {count})",
        "history": str(ATTEMPT_HISTORY_DEFAULT),
    }.items():
        settle = settle.replace(f"%({name})s", value)
    if "%(" in claim or "%(" in settle:
        raise RuntimeError("claim.sql or settle_many.sql has a parameter the ceiling does not set")
    # claim.sql writes its attempt history in data-modifying CTEs, which cannot be nested: its
    # final SELECT over the claimed rows becomes the aggregate pgbench reads.
    head, _, source = claim.rpartition(" SELECT ")
    if not source.endswith("FROM claimed"):
        raise RuntimeError("claim.sql no longer ends with its SELECT over the claimed rows")
    keys = (
        f"{head} SELECT coalesce(array_agg(tenant_id), '{{}}') AS t, "
        "coalesce(array_agg(operation_id), '{}') AS o, coalesce(array_agg(fence), '{}') AS f "
        "FROM claimed"
    )
    return f"BEGIN;\n{keys}\n\\gset\n{settle};\nCOMMIT;\n"


def _pgbench(url: str, script: str, clients: int, *limit: str) -> None:
    args, dbname = _pgbench_env(url)
    with tempfile.NamedTemporaryFile("w", suffix=".pgb") as f:
        f.write(script)
        f.flush()
        options = ["-n", "-M", "prepared", "-f", f.name, "-c", str(clients), "-j", "2", *limit]
        done = subprocess.run(
            [binary("pgbench"), *args, *options, dbname],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
            # the sessions the bridge's pool opens: one plan per statement, no JIT
            env={**os.environ, "PGOPTIONS": GENERIC_PLANS},
        )
    if done.returncode != 0:
        raise RuntimeError(f"pgbench failed ({done.returncode}): {done.stderr[-2000:]}")


def claim_settle_ceiling(url: str, jobs: int, clients: int) -> Rate:
    """Drain ``jobs`` queued rows with pgbench; first claim to last settlement, database clock.

    ``url`` is a migrated database of its own. Each client runs enough transactions to drain
    its share twice over; the transactions after the queue ran dry claim nothing and count for
    nothing (the span ends at the last settlement).
    """
    prepare_queue(url, "ceiling", jobs)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
    per_client = max(1, 2 * jobs // (CEILING_BATCH * clients))
    _pgbench(url, claim_settle_script(), clients, "-t", str(per_client))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE work_item")
        row = conn.execute(SPAN).fetchone()
    assert row is not None
    return Rate(int(row[0]), float(row[1] or 0.0))


def commit_ceiling(url: str, clients: int, seconds: int) -> Rate:
    """Single-row insert commits per second at ``clients`` connections, by the database clock."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(COMMIT_TABLE)
        conn.execute("TRUNCATE bench_commit")
    _pgbench(url, COMMIT_SCRIPT, clients, "-T", str(seconds))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE bench_commit")
        row = conn.execute(
            "SELECT count(*), extract(epoch FROM max(at) - min(at)) FROM bench_commit"
        ).fetchone()
        conn.execute("DROP TABLE bench_commit")
    assert row is not None
    return Rate(int(row[0]), float(row[1] or 0.0))
