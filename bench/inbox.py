"""Inbox to settle, end to end, with no broker: ingest, claim and complete in one process.

One writer thread per subscription writes ``--deliveries`` new deliveries between them through
:class:`~bridge.ingest.inbox.Inbox` in batches of 10 (one transaction each, as a consumer writes a
received batch), as fast as its commits return; the inbox writes the new rows a
:class:`~bridge.runtime.worker.WorkerPool` has free slots for already claimed and hands it the rest
by key (16 threads, a no-op class B handler; its prefetch and claimers at the best a sweep found,
:data:`PREFETCH` and :data:`CLAIMERS`), which drains them while they arrive. Eight writers
(:data:`SUBSCRIPTIONS`) offer more than the pool drains, so the bridge, not the offered load,
is what is measured. The rate is the deliveries over the time from the first work row's creation to
the last settlement, by the database clock (``work_item.created_at`` and ``settled_at``, read
after ``ANALYZE``); beside it, the ingest alone (first to last creation). Each round runs twice:
on a database in use (a settled history, analyzed, before the round: the report's headline) and
on a new one, whose only statistics are those of the empty tables its migration analyzed.

The round on a database in use also runs as replicas (``--replicas``, 2 by default): as many
processes, each one a whole bridge as ``fencebridge run`` would be, with its own writer per
subscription and a pool of 16 / N threads, so the jobs in flight stay 16. The deliveries are
shared between them as a broker shares one subscription's messages among its consumers: each
replica writes its own part. docs/operations.md ("Scaling: threads or replicas") recommends
replicas where one process's interpreter is the limit, about one per core.

The ceiling is the same server's single-row commit rate (:func:`bench.ceiling.commit_ceiling`,
``pgbench`` inserting one row per transaction) at 1 and at 16 clients, measured in the same
run, between the rounds: each delivery costs at least its share of an inbox commit and of a
settle commit, so end to end at 0.3x the single-row ceiling means the two commit paths are
batched well. Beside it, the ceiling of the protocol's own statements
(:func:`bench.ceiling.inbox_ceiling`: ``pgbench`` inserting batches of 10 as the inbox does for
a pool with room, written claimed, then settling them, at 16 clients, with no Python in the
way): how much of
the gap to the commit ceiling is the server's work per delivery, how much the process's. The
decoder is the benchmark's own (the delivery's identifiers are its attributes), so decoding
rules do not enter the measure::

    python -m bench.inbox                  # 3 rounds of 20,000 deliveries, 8 subscriptions
    python -m bench.inbox --quick          # 1 round of 4,000
    python -m bench.inbox --subscriptions 4 --deliveries 40000 --database-url postgresql://...
    python -m bench.inbox --replicas 1     # one process only
    python -m bench.inbox --prefetch 0 --claimers 1   # the pool's defaults
    python -m bench.inbox --quick --resend 0.1        # also each round with 10% re-sent

With ``--resend FRACTION``, every round also runs with that fraction of its deliveries being
copies of earlier ones, as a broker's redeliveries (a visibility timeout, a lost ack): each
delivery after the first batch is a copy with that chance, of an operation the same writer sent
in an earlier batch, picked at random. The rounds with and without run side by side in the same
run, so the report gives the ratio of their rates. A round's rate counts every delivery, the
copies included (they are what the broker hands out), and its client CPU is per delivery.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg

from bench.ceiling import Rate, commit_ceiling, inbox_ceiling
from bench.store import (
    BODY,
    arguments,
    bench_database,
    cell,
    command_line,
    cpu_since,
    cpu_times,
    facts_table,
    log,
    planned,
    report_facts,
    server,
)
from bench.workers import JOB_TYPE, Noop, Settled, SharedSettled
from bridge.executors.registry import Registry
from bridge.identity import IdentityHasher
from bridge.ingest.inbox import Inbox
from bridge.runtime.collector import settle_in
from bridge.runtime.worker import WorkerPool
from bridge.store import PostgresStore, ingest
from bridge.store.claims import ClaimPolicy
from bridge.types import Delivery, RawDelivery, Rejection, TargetClass

BATCH = 10
THREADS = 16
#: the pool's own knobs at their best for this load, by a sweep on 6 December 2026 (in the
#: morning prefetch 0, 48, 96, 160, 192 and 256, one and two claimers; in the afternoon, with
#: the inbox's one-statement write and no collector passes, 160, 320, 480 and 640;
#: docs/benchmarks.md): rows claimed beyond the threads, waiting for one while the next claim
#: is in flight, and claim rounds in flight
PREFETCH = 640
CLAIMERS = 1
#: writer threads, one per subscription: on the morning of 6 December, with four the ingest
#: was the limit of one process (its rows/s equal to the end to end), with eight the pool; with
#: the afternoon's cheaper pool and prefetch 640, eight writers are the limit again
#: (docs/benchmarks.md)
SUBSCRIPTIONS = 8
#: a round may not take longer than this
ROUND_TIMEOUT = 1800.0

SPANS = """
SELECT count(*) FILTER (WHERE state = 'succeeded'),
       extract(epoch FROM max(settled_at) - min(created_at)),
       extract(epoch FROM max(created_at) - min(created_at))
  FROM work_item
 WHERE subscription <> 'history'
"""

#: a deployment's settled history, analyzed, before a round on a database already in use
HISTORY = """
INSERT INTO work_item (tenant_id, operation_id, subscription, job_type, target_class,
                       payload_hash, payload_ref, state, settled_at)
SELECT 'history', 'op-' || g, 'history', 'noop', 'B', sha256(g::text::bytea), 'history:' || g,
       'succeeded', now()
  FROM generate_series(1, %(rows)s) AS g
"""
HISTORY_ROWS = 20_000


@dataclass(frozen=True)
class Plan:
    runs: int
    deliveries: int
    subscriptions: int
    ceiling_seconds: int
    #: processes of the replicas' rounds (1: none)
    replicas: int = 2
    #: the pool's prefetch (shared between the replicas) and claimers (each replica's)
    prefetch: int = PREFETCH
    claimers: int = CLAIMERS
    #: claims tenant-fair, as `fencebridge run` claims by default (off: in due order)
    fairness: bool = False
    #: every batch after the first carries the previous batch's first delivery again (one
    #: replay in eleven copies), of a row usually being claimed or settled at that moment
    replays: bool = False
    #: record replays beside their rows (migration 0030's delivery evidence); off: the same
    #: rounds without the record, to measure what it costs
    evidence: bool = True
    #: the fraction of deliveries that are copies of earlier ones (a broker's redeliveries);
    #: above 0, every round also runs with them, beside the round without
    resend: float = 0.0


FULL = Plan(runs=3, deliveries=20_000, subscriptions=SUBSCRIPTIONS, ceiling_seconds=10)
QUICK = Plan(runs=1, deliveries=4_000, subscriptions=SUBSCRIPTIONS, ceiling_seconds=3)


def decoder(raw: RawDelivery) -> Delivery | Rejection:
    """The bench's own rules: identifiers from attributes, the body as the payload."""
    return Delivery(
        tenant_id=raw.attributes["tenant"],
        operation_id=raw.attributes["operation"],
        subscription=raw.subscription,
        job_type=JOB_TYPE,
        target_class=TargetClass.B,
        payload=raw.body,
        broker_message_id=raw.message_id,
    )


def writer(  # noqa: PLR0917  (a thread's target takes its arguments in order)
    inbox: Inbox,
    subscription: str,
    count: int,
    errors: list[Exception],
    first: int = 0,
    replays: bool = False,
    copies: int = 0,
) -> None:
    """``count`` new deliveries of ``subscription`` in batches, numbered from ``first``; with
    ``replays``, each batch after the first also carries the previous batch's first again; with
    ``copies``, that many deliveries beside them are copies (see :func:`stream`)."""

    def raw(i: int) -> RawDelivery:
        return RawDelivery(
            subscription=subscription,
            message_id=f"{subscription}-{i}",
            body=BODY,
            attributes={"tenant": "bench", "operation": f"{subscription}-{i}"},
        )

    try:
        if copies:
            sent = stream(range(first, first + count), copies, random.Random(subscription))
            for start in range(0, len(sent), BATCH):
                inbox.write([raw(i) for i in sent[start : start + BATCH]])
            return
        for start in range(first, first + count, BATCH):
            again = [raw(start - BATCH)] if replays and start > first else []
            inbox.write(
                [*again, *(raw(i) for i in range(start, min(start + BATCH, first + count)))]
            )
    except Exception as exc:  # noqa: BLE001  (reported by the round: never a silent failure)
        errors.append(exc)


def stream(operations: Sequence[int], copies: int, rng: random.Random) -> list[int]:
    """The operations in order with ``copies`` copies among them, as a broker redelivers: the
    copies at places drawn at random after the first batch (each delivery from there a copy
    with the same chance), each a copy of an operation sent in an earlier batch, picked at
    random."""
    total = len(operations) + copies
    places = set(rng.sample(range(BATCH, total), copies))
    fresh = iter(operations)
    sent: list[int] = []
    for place in range(total):
        earlier = place - place % BATCH  # what earlier batches sent
        sent.append(sent[rng.randrange(earlier)] if place in places else next(fresh))
    return sent


@dataclass(frozen=True)
class Usage:
    """CPU seconds of one round: the bridge's process(es), and the whole machine's busy time
    over the same window (the bridge, PostgreSQL, anything else running); None where
    ``/proc/stat`` cannot be read."""

    client: float
    machine: float | None
    #: the machine's share of its cores busy over the window
    busy: float | None


@dataclass(frozen=True)
class Round:
    #: deliveries written (copies included), operations settled
    deliveries: int
    settled: int
    end_to_end: float
    ingest: float
    cpu_ms: float
    #: the machine's busy CPU per delivery over the drain's window, and its busy share
    machine_ms: float | None = None
    busy: float | None = None


def one_round(url: str, plan: Plan, *, in_use: bool, replicas: int = 1) -> Round:
    """One round on a new database, or (``in_use``) on one that already holds a settled
    history, analyzed: a new deployment's connections plan their statements on the empty
    tables a migration analyzed, until autovacuum's first ANALYZE replans them. With
    ``replicas`` above 1, the bridge runs as that many processes; with ``plan.resend``, that
    share of the deliveries are copies."""
    if in_use:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(HISTORY, {"rows": HISTORY_ROWS})
            conn.execute("ANALYZE")
    if replicas == 1:
        used = serve(url, plan, 0, 1, Settled(_operations(plan, 1)))
    else:
        used = serve_replicas(url, plan, replicas)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE work_item")
        row = conn.execute(SPANS).fetchone()
    assert row is not None
    count, span, ingest = int(row[0]), float(row[1] or 0), float(row[2] or 0)
    expected = _operations(plan, replicas)
    if count != expected:
        raise RuntimeError(f"settled {count} of {expected} operations")
    delivered = _total(plan, replicas)
    machine = used.machine * 1000 / delivered if used.machine is not None else None
    return Round(
        delivered,
        count,
        delivered / span,
        delivered / ingest if ingest else 0.0,
        used.client * 1000 / delivered,
        machine,
        used.busy,
    )


def machine_since(start: tuple[int, int, int] | None) -> tuple[float | None, float | None]:
    """The machine's busy CPU seconds since ``start`` (``/proc/stat``), and its busy share."""
    spent = cpu_since(start)
    if spent is None:
        return None, None
    busy, _, total = spent
    return busy / os.sysconf("SC_CLK_TCK"), busy / total


def _share(plan: Plan, replicas: int) -> int:
    """The deliveries of one subscription that one replica writes."""
    return plan.deliveries // plan.subscriptions // replicas


def _total(plan: Plan, replicas: int) -> int:
    """The deliveries a round writes: ``--deliveries`` rounded down to a whole share for each
    writer."""
    return _share(plan, replicas) * plan.subscriptions * replicas


def _copies(plan: Plan, replicas: int) -> int:
    """The copies among one writer's share (``--resend``)."""
    return round(_share(plan, replicas) * plan.resend)


def _operations(plan: Plan, replicas: int) -> int:
    """The operations a round writes, its deliveries less the copies (a round waits for
    exactly this many settlements)."""
    return (_share(plan, replicas) - _copies(plan, replicas)) * plan.subscriptions * replicas


def serve(url: str, plan: Plan, index: int, replicas: int, settled: Settled) -> Usage:
    """One bridge: a writer per subscription and a pool of ``THREADS / replicas`` threads,
    until ``settled`` says every delivery of the round settled; its CPU seconds, and the
    machine's from its pool's start to the last settlement."""
    threads = THREADS // replicas
    if not plan.evidence:  # the same rounds without the replay count: its cost
        ingest.record_replays = lambda *_: None
    size = threads + plan.claimers + 1 + plan.subscriptions + 2
    store = PostgresStore.connect(
        url,
        min_size=size,
        max_size=size,
        generic_plans=True,
        policy=ClaimPolicy(fairness={} if plan.fairness else None),
    )
    try:
        store.pool.wait()
        registry = Registry()
        registry.register(JOB_TYPE, Noop())
        pool = WorkerPool(
            store,
            registry,
            IdentityHasher.ephemeral(),
            worker_id=f"bench-{index}",
            threads=threads,
            prefetch=plan.prefetch // replicas,
            claimers=plan.claimers,
            events=settled,
        )
        inbox = Inbox(store.inbox, decoder, pool=pool)
        copies = _copies(plan, replicas)
        per = _share(plan, replicas) - copies
        errors: list[Exception] = []
        writers = [
            threading.Thread(
                target=writer,
                args=(inbox, f"sub{s}", per, errors, index * per, plan.replays, copies),
            )
            for s in range(plan.subscriptions)
        ]
        settle_in()  # as `fencebridge run` does before it starts
        machine_started = cpu_times()
        cpu_started = time.process_time()
        pool.start()
        for w in writers:
            w.start()
        for w in writers:
            w.join(ROUND_TIMEOUT)
        if errors:
            raise RuntimeError(f"a writer failed: {type(errors[0]).__name__}") from errors[0]
        settled.done.wait(ROUND_TIMEOUT)
        machine, busy = machine_since(machine_started)
        pool.stop()
        return Usage(time.process_time() - cpu_started, machine, busy)
    finally:
        store.close()


def serve_replicas(url: str, plan: Plan, replicas: int) -> Usage:
    """The round as ``replicas`` processes sharing the deliveries; their CPU seconds, and the
    machine's over the first replica's window (its pool's start to the last settlement of
    any: the replicas start within a moment of each other)."""
    context = multiprocessing.get_context("spawn")
    left, done = context.Value("l", _operations(plan, replicas)), context.Event()
    cpu = context.Value("d", 0.0)
    machine = context.Array("d", [-1.0, -1.0])
    children = [
        context.Process(target=replica, args=(url, plan, i, replicas, left, done, cpu, machine))
        for i in range(replicas)
    ]
    for child in children:
        child.start()
    deadline = time.monotonic() + ROUND_TIMEOUT
    while any(c.is_alive() for c in children) and time.monotonic() < deadline:
        if any(c.exitcode not in (None, 0) for c in children):
            done.set()  # the others stop; the round is reported as failed below
        time.sleep(0.1)
    done.set()  # past the deadline, the replicas still running stop too
    for child in children:
        child.join(10.0)
        if child.is_alive():
            child.terminate()
            child.join()
    failed = [c.exitcode for c in children if c.exitcode != 0]
    if failed:
        raise RuntimeError(f"a replica ended with exit code {failed[0]}")
    seconds, busy = machine[0], machine[1]
    return Usage(float(cpu.value), seconds if seconds >= 0 else None, busy if busy >= 0 else None)


def replica(  # noqa: PLR0917  (a process's target takes its arguments in order)
    url: str, plan: Plan, index: int, replicas: int, left: Any, done: Any, cpu: Any, machine: Any
) -> None:
    """A replica's process: one bridge, counting its settlements into the shared count and
    its CPU seconds (from its pool's start, as in one process) into ``cpu``; the first
    replica writes the machine's busy seconds and share into ``machine``."""
    settled = SharedSettled(left, done)
    try:
        used = serve(url, plan, index, replicas, settled)
    finally:
        settled.close()
    with cpu.get_lock():
        cpu.value += used.client
    if index == 0 and used.machine is not None and used.busy is not None:
        machine[0], machine[1] = used.machine, used.busy


#: the two kinds of database a round runs on, the headline first
IN_USE = "database in use"
NEW = "new database"


@dataclass(frozen=True)
class Kind:
    """A kind of round: its database, and the processes the bridge runs as."""

    database: str
    replicas: int = 1
    #: the share of its deliveries that are copies (``--resend``)
    resend: float = 0.0

    def __str__(self) -> str:
        shape = self.database
        if self.replicas > 1:
            shape += f", {self.replicas} replicas"
        if self.resend:
            shape += f", {self.resend:.0%} re-sent"
        return shape


def kinds(plan: Plan) -> list[Kind]:
    """The rounds of one run, the headline first; replicas on a database in use; with
    ``--resend``, each beside the same with copies."""
    shapes = [Kind(IN_USE), Kind(NEW)]
    if plan.replicas > 1:
        shapes.append(Kind(IN_USE, plan.replicas))
    if plan.resend:
        return [k for s in shapes for k in (s, replace(s, resend=plan.resend))]
    return shapes


@dataclass
class Report:
    plan: Plan
    facts: list[tuple[str, str]] = field(default_factory=list)
    rounds: dict[Kind, list[Round]] = field(default_factory=dict)
    ceilings: dict[int, list[Rate]] = field(default_factory=dict)
    #: the inbox's own statements through pgbench, at THREADS clients
    statements: list[Rate] = field(default_factory=list)

    def markdown(self) -> str:
        plan = self.plan
        replicas = (
            f" The replicas' rounds run the bridge as {plan.replicas} processes, each with its "
            f"own writer per subscription, writing its share of the deliveries, and a pool of "
            f"{THREADS // plan.replicas} threads and a prefetch of "
            f"{plan.prefetch // plan.replicas} ({THREADS} in flight in all)."
            if plan.replicas > 1
            else ""
        )
        lines = [
            f"{plan.runs} round(s) of each kind, {plan.deliveries:,} deliveries each: "
            f"{plan.subscriptions} subscription(s), one writer thread each, batches of "
            f"{BATCH}; a pool of {THREADS} threads, {plan.claimers} claimer(s) and a prefetch of "
            f"{plan.prefetch} rows draining"
            f"{', claiming tenant-fair' if plan.fairness else ''}; medians with min..max. A "
            "database "
            f"in use holds {HISTORY_ROWS:,} settled rows, analyzed, before the round; a new "
            "database has only the statistics of the empty tables its migration analyzed (the "
            "bridge's connections plan on those until autovacuum analyzes the grown tables)."
            + replicas,
            "",
            *facts_table(self.facts),
            "",
            "| measure | deliveries/s |",
            "| --- | ---: |",
        ]
        for kind, rounds in self.rounds.items():
            lines += [
                f"| end to end, {kind}: first ingest to last settlement | "
                f"{cell([r.end_to_end for r in rounds])} |",
                f"| ingest alone, {kind}: first to last work row | "
                f"{cell([r.ingest for r in rounds])} |",
            ]
        for clients, rates in sorted(self.ceilings.items()):
            lines.append(
                f"| single-row commits, pgbench, {clients} client(s) | "
                f"{cell([r.per_second for r in rates])} |"
            )
        if self.statements:
            lines.append(
                f"| the inbox's statements alone, pgbench, {THREADS} clients: insert written "
                f"claimed, settle | {cell([r.per_second for r in self.statements])} |"
            )
        lines.append("")
        for kind, rounds in self.rounds.items():
            cpu = statistics.median(r.cpu_ms for r in rounds)
            whole = "the whole process" if kind.replicas == 1 else "every replica's process"
            lines.append(f"Client CPU ({whole}), {kind}: {cpu:.2f} ms per delivery.")
        for kind, rounds in self.rounds.items():
            plain = self.rounds.get(replace(kind, resend=0.0))
            if not kind.resend or not plain:
                continue
            ratio = statistics.median(r.end_to_end for r in rounds) / statistics.median(
                r.end_to_end for r in plain
            )
            lines.append(
                f"With {kind.resend:.0%} of the deliveries re-sent ({kind}): end to end at "
                f"{ratio:.2f}x the rate without."
            )
        cores = os.cpu_count() or 1
        for kind, rounds in self.rounds.items():
            measured = [r for r in rounds if r.machine_ms is not None and r.busy is not None]
            if not measured or not all(r.machine_ms for r in measured):
                continue
            machine = statistics.median(r.machine_ms or 0.0 for r in measured)
            busy = statistics.median(r.busy or 0.0 for r in measured)
            lines.append(
                f"Machine CPU (the bridge, PostgreSQL and anything else on the host), {kind}, "
                f"from the pool's start to the last settlement: {machine:.2f} ms per delivery, "
                f"{busy:.0%} of the {cores} cores busy; at that cost the cores, all busy, "
                f"would carry {cores * 1000 / machine:,.0f} deliveries/s."
            )
        if self.ceilings:
            top = max(statistics.median(r.per_second for r in v) for v in self.ceilings.values())
            for kind, rounds in self.rounds.items():
                if kind.database != IN_USE:
                    continue
                e2e = statistics.median(r.end_to_end for r in rounds)
                lines.append(
                    f"End to end ({kind}) at {e2e / top:.2f}x the best single-row commit "
                    f"ceiling ({top:,.0f} commits/s)."
                )
            lines.append(
                f"0.3x that ceiling ({0.3 * top:,.0f} deliveries/s) leaves the host "
                f"{cores * 1000 / (0.3 * top):.2f} ms of CPU per delivery with every core busy."
            )
        if self.ceilings and self.statements:
            top = max(statistics.median(r.per_second for r in v) for v in self.ceilings.values())
            own = statistics.median(r.per_second for r in self.statements)
            lines.append(
                f"The inbox's statements alone at {own / top:.2f}x that ceiling "
                f"({own:,.0f} rows/s); end to end ({IN_USE}) at "
                f"{statistics.median(r.end_to_end for r in self.rounds[Kind(IN_USE)]) / own:.2f}x "
                "of them."
            )
        return "\n".join(lines) + "\n"


def run(database_url: str | None, plan: Plan, argv: list[str]) -> Report:
    report = Report(plan)
    with server(database_url) as admin_url, report_facts(admin_url, argv) as facts:
        report.facts = facts
        for k in range(plan.runs):
            for kind in kinds(plan):
                with bench_database(admin_url, "inbox") as url:
                    result = one_round(
                        url,
                        replace(plan, resend=kind.resend),
                        in_use=kind.database == IN_USE,
                        replicas=kind.replicas,
                    )
                log(f"round {k + 1}, {kind}: end to end {result.end_to_end:,.0f}/s")
                report.rounds.setdefault(kind, []).append(result)
            with bench_database(admin_url, "commits") as url:
                for clients in (1, THREADS):
                    rate = commit_ceiling(url, clients, plan.ceiling_seconds)
                    log(f"round {k + 1}: {clients} client(s): {rate.per_second:,.0f} commits/s")
                    report.ceilings.setdefault(clients, []).append(rate)
            with bench_database(admin_url, "statements") as url:
                rate = inbox_ceiling(url, THREADS, plan.ceiling_seconds)
                log(f"round {k + 1}: the inbox's statements: {rate.per_second:,.0f} rows/s")
                report.statements.append(rate)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments("bench.inbox", "Inbox to settle, end to end, against the commit ceiling.")
    parser.add_argument("--runs", type=int, help="rounds")
    parser.add_argument("--deliveries", type=int, help="deliveries per round")
    parser.add_argument("--subscriptions", type=int, help="writer threads, one per subscription")
    parser.add_argument(
        "--replicas", type=int, help="processes of the replicas' rounds (default 2; 1: none)"
    )
    parser.add_argument("--prefetch", type=int, help=f"the pool's prefetch (default {PREFETCH})")
    parser.add_argument("--claimers", type=int, help=f"the pool's claimers (default {CLAIMERS})")
    parser.add_argument(
        "--fairness",
        action="store_const",
        const=True,
        help="claim tenant-fair, as `fencebridge run` does by default (default: in due order)",
    )
    parser.add_argument(
        "--replays",
        action="store_const",
        const=True,
        help="one replay in every batch after the first, of the previous batch's first",
    )
    parser.add_argument(
        "--resend",
        type=float,
        metavar="FRACTION",
        help="also run each round with this fraction of its deliveries copies of earlier ones, "
        "as a broker redelivers (default 0: none)",
    )
    parser.add_argument(
        "--no-evidence",
        dest="evidence",
        action="store_const",
        const=False,
        help="do not record replays (delivery_copy) (to measure the delivery evidence's cost)",
    )
    args, command = command_line(parser, argv)
    names = (
        "runs",
        "deliveries",
        "subscriptions",
        "replicas",
        "prefetch",
        "claimers",
        "fairness",
        "replays",
        "evidence",
        "resend",
    )
    plan = planned(QUICK if args.quick else FULL, args, names)
    if plan.replicas < 1 or THREADS % plan.replicas:
        parser.error(f"--replicas must divide the pool's {THREADS} threads")
    if plan.prefetch < 0 or plan.claimers < 1:
        parser.error("--prefetch is 0 or more, --claimers 1 or more")
    if not 0 <= plan.resend < 1:
        parser.error("--resend is a fraction of the deliveries, from 0 up to (not) 1")
    print(run(args.database_url, plan, command).markdown(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
