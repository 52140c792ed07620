"""What the server itself can do, measured in the same run as the systems compared with it.

* :func:`claim_settle_ceiling`: ``pgbench`` running the project's own claim (``claim_fair.sql``,
  the pool's, for 10 rows) and ``settle_many.sql`` for the rows it claimed, one transaction per
  pair, prepared, with no Python in the way: the most the pool's statements can do here.
* :func:`commit_ceiling`: ``pgbench`` committing single-row inserts: the most commits per
  second the server makes at that many clients (the end-to-end benchmark's ceiling).
* :func:`inbox_ceiling`: ``pgbench`` running the inbox's own statements end to end: a batch of
  10 new deliveries inserted as the inbox writes them for a pool with room
  (``ingest_batch.sql``, one statement: the rows written claimed, and the check that every
  key was decided and none has a tombstone), then settled (``settle_many.sql``) in a transaction:
  the most the protocol's statements do here, with no Python in the way.

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

from bench.store import BODY, binary, fill_history, prepare_queue
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
INBOX_SPAN = """
SELECT count(*) FILTER (WHERE state = 'succeeded'),
       extract(epoch FROM max(settled_at) - min(created_at))
  FROM work_item
 WHERE tenant_id = 'bench'
"""
#: settled rows the inbox ceiling's database holds, analyzed, before pgbench plans on it
INBOX_HISTORY = 20_000


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
    claim = _bind(
        _strip(sql.with_limit("claim_fair", CEILING_BATCH)),
        {
            "now": "NULL",
            "job_types": "NULL",
            "worker": "'pgbench'",
            "lease": "'5 minutes'",
            "identity_keys": "NULL",  # any identity key, as a process holding every key claims
            "history": str(ATTEMPT_HISTORY_DEFAULT),
            "after": "''",  # every claim walks from the first tenant: one tenant here
            "weights": "NULL",
        },
    )
    keys = _aggregated(
        claim,
        "claimed",
        "coalesce(array_agg(tenant_id), '{}') AS t, coalesce(array_agg(operation_id), '{}') AS o, "
        "coalesce(array_agg(fence), '{}') AS f",
    )
    return f"BEGIN;\n{keys}\n\\gset\n{_settle_text()};\nCOMMIT;\n"


def _settle_text() -> str:
    """settle_many.sql as every claimed row's success, for the arrays ``:t``, ``:o``, ``:f``
    a claim's ``\\gset`` left."""
    count = "ARRAY[cardinality(:f::bigint[])]"
    return _bind(
        _strip(sql.statement("settle_many")),
        {
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
        },
    )


def _bind(text: str, values: dict[str, str]) -> str:
    """A statement's named parameters replaced by pgbench expressions; every one must be."""
    for name, value in values.items():
        text = text.replace(f"%({name})s", value).replace(f"%({name})b", value)
    if "%(" in text:
        raise RuntimeError(f"a statement has a parameter the ceiling does not set: {text[:80]}")
    return text


def _aggregated(statement: str, source: str, columns: str) -> str:
    """A statement whose final SELECT over its data-modifying CTE ``source`` (and the filter
    after it, if any) becomes one row of arrays (``columns``) for pgbench's ``\\gset``: such
    CTEs cannot be nested in another query."""
    head, _, tail = statement.rpartition(" SELECT ")
    _, found, rest = tail.partition(f" FROM {source}")
    if not found or (rest and not rest.startswith(" WHERE ")):
        raise RuntimeError(f"a statement no longer ends with its SELECT over {source}")
    return f"{head} SELECT {columns} FROM {source}{rest}"


def inbox_script() -> str:
    """Two pgbench transactions per batch of 10 new deliveries: the inbox's one statement (its
    batch as the JSON text and binary bodies the store sends, built by ``format``, so the
    server parses what it parses for a Python client), every row written claimed as for a pool
    with free slots, with its check (every key new, no tombstone; with no identity keys, as
    the benchmark's store, any tombstone refuses), then the settlement of the rows it claimed."""
    row = (
        '["bench","%1$s-%2$s-{g}","sub","noop","B",null,"{digest}","pg:%1$s-%2$s-{g}",5,null,'
        '"m-{g}",null,null,0,300]'
    )
    digest = "00" * 32
    body = f"convert_to(repeat('x', {len(BODY)}), 'UTF8')"  # the benchmark's body's size
    template = "[" + ",".join(row.format(g=g, digest=digest) for g in range(CEILING_BATCH)) + "]"
    insert = _bind(
        _strip(sql.statement("ingest_batch")),
        {
            "rows": f"format('{template}', :client_id::int, :n::bigint)",
            "body": f"array_fill({body}, ARRAY[{CEILING_BATCH}])",
            "now": "NULL",
            "identity_key_id": "NULL",
            "aging": "0",
            "worker": "'pgbench'",
            "key_id": "'{}'",
            "operation_hash": "'{}'",
            "any_erased": "true",
            "expected": str(CEILING_BATCH),
            "copies": "NULL",
            "conflict": "''",
        },
    )
    insert = _aggregated(
        insert,
        "keyed",
        "array_agg(tenant_id) AS t, array_agg(operation_id) AS o, "
        "array_fill(1::bigint, ARRAY[count(*)::int]) AS f",  # written claimed: fence 1
    )
    return f"\\set n random(1, 2000000000)\n{insert}\n\\gset\nBEGIN;\n{_settle_text()};\nCOMMIT;\n"


def inbox_ceiling(url: str, clients: int, seconds: int) -> Rate:
    """:func:`inbox_script` at ``clients`` connections for ``seconds``; the rows settled over
    first row created to last settlement, database clock. ``url`` is a migrated database of
    its own; it is given a settled history first, analyzed, as the end-to-end benchmark's
    database in use is: pgbench plans each statement once, at its first run, and a plan made on
    an empty table joins the claim's and the settlement's keys to every row of work_item
    (``enable_seqscan`` is off, so through a full scan of its primary key), a cost that grows
    with the table while it runs."""
    fill_history(url, INBOX_HISTORY)
    _pgbench(url, inbox_script(), clients, "-T", str(seconds))
    return _read_back(url, INBOX_SPAN)


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
    return _read_back(url, SPAN)


def _read_back(url: str, span: str) -> Rate:
    """Rows and seconds by ``span`` (a count and an epoch), after ``ANALYZE``."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE work_item")
        row = conn.execute(span).fetchone()
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
