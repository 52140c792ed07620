"""A slow, then silent network between the bridge and its database, at volume, then healed.

A PostgreSQL server of its own (built from the installed server's binaries, on its own free
port); two ``fencebridge run`` processes reach it over TCP through the test's proxy, and the test
itself over the server's Unix socket, so no fault cuts the test's own queries. Moto's SQS (a
process of its own) delivers 1,000 operations, half class A (an effect row in the bridge's
database), half class D (a call logged in another server's database, which the fault does not
reach), 100 sent twice and 10 sent again with another payload. The bridges run with small TCP
settings: keepalives after 2 s idle, every 1 s, 2 probes; ``tcp_user_timeout`` 3 s.

1. **Latency**: 200 ms added to every chunk the proxy forwards, each way, while work goes on.
2. **Drop**: iptables drops every packet to and from the proxy's port (no RST, no FIN, nothing
   acknowledged: :mod:`tests.support.partition`) for longer than the lease and the user timeout.
   Statements in flight and connections idle in the pool must break by those timeouts, not wait
   for the kernel's retransmissions (about 15 minutes): ``/readyz`` must answer 503 within
   lease + user timeout + a margin, and stay so while the drop lasts.
3. **Heal**: packets flow, no latency; both bridges ready again and the backlog drains.

At the end: every operation has exactly one work row; every class A effect is there once;
no class D call was made twice, and each class D row that succeeded made its call (a row whose
outcome the drop hid is ``unknown``, called at most once); nothing queued or claimed is left;
``/readyz`` answers 200 with no service reported, and no handler was ever reported holding its
thread past its bound.

With both TCP settings at ``0`` (the operating system's), the same run kept ``/readyz`` at 200
through the whole drop: every thread waited in the kernel's retransmissions.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

from bridge.store.migrate import migrate
from tests.support.bridge_process import BridgeProcess, Job, SqsBridgeConfig, bridge_env
from tests.support.failover_targets import create_target_tables
from tests.support.handlers import create_tables
from tests.support.partition import Partition, require_iptables
from tests.support.proxy import Proxy
from tests.support.replication import Node
from tests.support.sqs_server import SqsServer, queue_empty, send_operations, sqs_server_process
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(420)]

LEASE = 4.0
JOBS = {
    "ledger": Job("tests.support.handlers:RecordEffect", "A", lease_seconds=LEASE),
    "notify": Job(
        "tests.support.failover_targets:LogCall", "D", lease_seconds=LEASE, max_attempts=1
    ),
}
USER_TIMEOUT = 3.0
TCP = {
    "tcp_keepalives_idle_seconds": 2,
    "tcp_keepalives_interval_seconds": 1,
    "tcp_keepalives_count": 2,
    "tcp_user_timeout_seconds": USER_TIMEOUT,
}
OPERATIONS = 1_000
DUPLICATES = 100
CONFLICTS = 10
PAYLOAD = {"sleep_seconds": 0.01, "work_seconds": 0.01}
LATENCY = 0.2
#: operations settled before the latency, and settled under it before the drop
WARM_UP = 100
UNDER_LATENCY = 30
#: longer than the lease and the user timeout together
DROP_SECONDS = 2 * (LEASE + USER_TIMEOUT)
#: the longest the bridges may stay ready once the packets are dropped
RED_WITHIN = LEASE + USER_TIMEOUT + 3.0
#: the longest a statement sent into the silence may wait before its connection breaks (the
#: user timeout counts from the oldest byte not acknowledged: sent up to a latency earlier)
BROKEN_WITHIN = USER_TIMEOUT + 2.0
#: libpq's words for a connection the kernel gave up (ETIMEDOUT), as the bridge logs them
TIMED_OUT = "Connection timed out"
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
DEADLINE = 180.0


@dataclass
class Server:
    """The bridge's database server: the test's URL (Unix socket) and the bridges' (TCP)."""

    node: Node
    dbname: str = "fb"

    @property
    def local_url(self) -> str:
        return conninfo.make_conninfo(
            host=str(self.node.sockets),
            port=str(self.node.port),
            user="postgres",
            dbname=self.dbname,
            connect_timeout="5",
        )

    def query(self, statement: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.local_url, autocommit=True) as conn:
            return conn.execute(statement.encode()).fetchall()


@pytest.fixture
def server() -> Iterator[Server]:
    base = Path(tempfile.mkdtemp(prefix="fbp-"))
    os.chmod(base, 0o755)
    node = Node(base, settings={"max_connections": "150"})
    try:
        node.init()
        node.start()
        node.execute("CREATE DATABASE fb")
        found = Server(node)
        with psycopg.connect(found.local_url, autocommit=True) as conn:
            migrate(conn)
        create_tables(found.local_url)
        yield found
    finally:
        node.destroy()


@pytest.fixture
def moto() -> Iterator[SqsServer]:
    with sqs_server_process() as found:
        yield found


def job_of(op: str) -> str:
    return list(JOBS)[int(op.rsplit("-", 1)[1]) % len(JOBS)]


@dataclass
class Watch:
    """What the probes answered while the packets were dropped, per bridge."""

    red_after: list[float | None]
    green_during: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


def watch_drop(bridges: Sequence[BridgeProcess], seconds: float) -> Watch:
    """Poll ``/readyz`` of every bridge for ``seconds`` from now (the drop's start): when each
    first answered 503, and how often each answered 200 after that."""
    start = time.monotonic()
    watch = Watch(red_after=[None] * len(bridges), green_during=[0] * len(bridges))
    while (now := time.monotonic()) - start < seconds:
        for n, bridge in enumerate(bridges):
            code, body = bridge.probe("/readyz")
            if code == 503 and watch.red_after[n] is None:
                watch.red_after[n] = now - start
                watch.reasons.append(str(body.get("checks")))
            elif code == 200 and watch.red_after[n] is not None:
                watch.green_during[n] += 1
        time.sleep(0.1)
    return watch


def first_timed_out(log: str, since: datetime) -> float | None:
    """Seconds from ``since`` to the bridge's first log line saying a connection timed out
    (its lines are stamped in local time, to the millisecond)."""
    for line in log.splitlines():
        found = _STAMP.match(line)
        if found and TIMED_OUT in line:
            at = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f")
            if at >= since:
                return (at - since).total_seconds()
    return None


def settled(server: Server) -> int:
    ((count,),) = server.query(
        "SELECT count(*) FROM work_item WHERE state NOT IN ('queued', 'claimed')"
    )
    return int(count)


def drained(server: Server, sqs: Any, queue_url: str) -> bool:
    if server.query("SELECT count(*) FROM work_item WHERE state IN ('queued', 'claimed')")[0][0]:
        return False
    return queue_empty(sqs, queue_url)


def test_latency_then_a_dropped_network_longer_than_the_lease_then_healed(
    tmp_path: Path, server: Server, moto: SqsServer, db_url: str
) -> None:
    iptables = require_iptables()
    create_target_tables(db_url)  # class D's calls: on another server, out of the fault's way
    sqs = moto.client()
    queue_url = moto.create_queue(VisibilityTimeout="5")
    ops = [f"op-{i}" for i in range(OPERATIONS)]
    with Proxy("127.0.0.1", server.node.port) as proxy:
        cut = Partition(iptables, proxy.port)
        url = f"postgresql://postgres@127.0.0.1:{proxy.port}/{server.dbname}"
        bridges: list[BridgeProcess] = []
        try:
            for n in range(2):
                config = SqsBridgeConfig(
                    queue_url=queue_url,
                    endpoint_url=moto.endpoint,
                    jobs=JOBS,
                    worker_id=f"bridge-{n}",
                    settings=TCP,
                )
                bridges.append(
                    BridgeProcess.start(config, tmp_path, bridge_env(url, target_url=db_url))
                )
            for bridge in bridges:
                bridge.wait_ready()
            send_operations(sqs, queue_url, ops, PAYLOAD, job_type=job_of)
            send_operations(sqs, queue_url, ops[:DUPLICATES], PAYLOAD, job_type=job_of)
            send_operations(sqs, queue_url, ops[-CONFLICTS:], {"changed": True}, job_type=job_of)
            eventually(lambda: settled(server) >= WARM_UP, "the bridges at work", DEADLINE)

            # 1. latency: work goes on, slower
            proxy.latency = LATENCY
            before = settled(server)
            eventually(
                lambda: settled(server) >= before + UNDER_LATENCY,
                f"{UNDER_LATENCY} operations settled under {LATENCY * 1000:.0f} ms",
                DEADLINE,
            )
            under_latency = settled(server) - before

            # 2. the packets dropped, for longer than the lease and the user timeout
            left_at_drop = OPERATIONS - settled(server)
            assert left_at_drop > 0, "the drop must come while work is left"
            dropped_at = datetime.now()  # the bridges log in local time
            cut.drop()
            try:
                watch = watch_drop(bridges, DROP_SECONDS)
            finally:
                cut.heal()
            # 3. healed, no latency
            proxy.latency = 0.0
            healed = time.monotonic()
            for bridge in bridges:
                bridge.wait_ready(DEADLINE)
            recovered_after = time.monotonic() - healed
            eventually(
                lambda: drained(server, sqs, queue_url),
                "every message acknowledged, no row open",
                DEADLINE,
            )
            drained_after = time.monotonic() - healed
            answers = [bridge.probe("/readyz") for bridge in bridges]
            logs = [bridge.logs() for bridge in bridges]
            broken_after = [first_timed_out(log, dropped_at) for log in logs]
        finally:
            cut.heal()
            for bridge in bridges:
                bridge.close()
    counts = measure(server, db_url, ops)
    print(
        f"\npartition: {under_latency} settled under {LATENCY * 1000:.0f} ms, "
        f"{left_at_drop} left at the drop; /readyz 503 after {watch.red_after} s "
        f"(bound {RED_WITHIN} s), first reasons {watch.reasons}; first connection timed out "
        f"after {broken_after} s (bound {BROKEN_WITHIN} s); 200 during the drop "
        f"{watch.green_during}; ready "
        f"{recovered_after:.1f} s after the heal, drained {drained_after:.1f} s after; {counts}"
    )
    for n, red in enumerate(watch.red_after):
        assert red is not None, f"bridge-{n}: /readyz never 503 while the packets were dropped"
        assert red <= RED_WITHIN, f"bridge-{n}: /readyz 503 only after {red:.1f} s"
    assert watch.green_during == [0] * len(bridges), watch
    for n, broken in enumerate(broken_after):
        assert broken is not None, f"bridge-{n}: no connection broken by a timeout"
        assert broken <= BROKEN_WITHIN, f"bridge-{n}: first connection broken after {broken} s"
    for n, log in enumerate(logs):
        assert "held its worker thread" not in log, f"bridge-{n}: a handler held its thread"
    for code, body in answers:
        assert (code, body.get("services")) == (200, None), body
    assert counts["lost"] == 0, counts
    assert counts["rows"] == OPERATIONS, counts
    assert counts["open"] == 0, counts
    assert counts["effects_missing"] == counts["effects_twice"] == 0, counts
    assert counts["calls_twice"] == counts["calls_missing"] == 0, counts
    assert counts["class_a_not_succeeded"] == 0, counts


def measure(server: Server, target_url: str, ops: Sequence[str]) -> dict[str, int]:
    rows = dict(server.query("SELECT operation_id, count(*) FROM work_item GROUP BY 1"))
    states = dict(server.query("SELECT state, count(*) FROM work_item GROUP BY 1"))
    effects = dict(server.query("SELECT operation_id, count(*) FROM test_effect GROUP BY 1"))
    with psycopg.connect(target_url, autocommit=True) as conn:
        calls = dict(conn.execute("SELECT operation_id, count(*) FROM fo_call GROUP BY 1"))
    class_a = [op for op in ops if job_of(op) == "ledger"]
    class_d_succeeded = [
        op
        for (op,) in server.query(
            "SELECT operation_id FROM work_item WHERE job_type = 'notify' AND state = 'succeeded'"
        )
    ]
    not_succeeded = server.query(
        "SELECT count(*) FROM work_item WHERE job_type = 'ledger' AND state <> 'succeeded'"
    )[0][0]
    return {
        "rows": len(rows),
        "lost": sum(1 for op in ops if op not in rows),
        "rows_twice": sum(1 for n in rows.values() if n > 1),
        "open": int(states.get("queued", 0)) + int(states.get("claimed", 0)),
        "effects_missing": sum(1 for op in class_a if op not in effects),
        "effects_twice": sum(1 for n in effects.values() if n > 1),
        "calls": len(calls),
        "calls_twice": sum(1 for n in calls.values() if n > 1),
        "calls_missing": sum(1 for op in class_d_succeeded if op not in calls),
        "class_a_not_succeeded": int(not_succeeded),
        "succeeded": int(states.get("succeeded", 0)),
        "unknown": int(states.get("unknown", 0)),
    }
