"""The database fails mid-claim: no claim is handed out twice, no row is lost.

Real faults only: the postmaster is SIGKILLed and restarted (crash recovery), and a TCP proxy
between the store's pool and the server cuts connections while a statement is inside the
server. Callers must see :class:`StoreUnavailable` (a transient error) and nothing else, never a
hang; the database's record stays the truth, and the fence keeps every late writer out.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

import psycopg
import pytest
from psycopg import conninfo

from bridge.database import APPLICATION_NAME, connect, open_pool, translate_errors
from bridge.errors import LeaseLost, StoreError, StoreUnavailable, TransientError
from bridge.store import PostgresStore
from bridge.store.work import Settlement
from bridge.types import Claim, Delivery, Key, State, TargetClass, Ticket
from tests.support.cluster import Cluster
from tests.support.proxy import Proxy

T = TypeVar("T")

LEASE = timedelta(seconds=1.5)
#: Small, so a call made while the database is unreachable fails fast instead of queueing.
POOL_TIMEOUT = 2.0
#: Generous upper bounds for polling; a wait that reaches one means something hung.
DEADLINE = 60.0


def delivery(tenant: str, op: str) -> Delivery:
    return Delivery(
        tenant_id=tenant,
        operation_id=op,
        subscription="refunds",
        job_type="refund",
        target_class=TargetClass.C,
        payload=f'{{"op": "{op}"}}'.encode(),
        # Every lost claim costs an attempt; the test is about fences, not exhaustion.
        max_attempts=50,
    )


def open_store(url: str, *, max_size: int = 2) -> PostgresStore:
    return PostgresStore(open_pool(url, min_size=1, max_size=max_size, timeout=POOL_TIMEOUT))


def wait_for(
    what: str, predicate: Callable[[], T | None], timeout: float = DEADLINE, interval: float = 0.02
) -> T:
    """Poll until ``predicate`` returns something truthy; fail naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


def fetch(url: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Ad-hoc read on a connection of its own (the pool's connections are under test)."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def row_state(url: str, key: Key) -> tuple[State, int, str | None]:
    [(state, fence, owner)] = fetch(
        url,
        # the lease holder: a row that is no longer claimed keeps its last owner, holding nothing
        "SELECT state, fence, CASE WHEN state = 'claimed' THEN lease_owner END FROM work_item"
        " WHERE tenant_id = %s AND operation_id = %s",
        (key.tenant_id, key.operation_id),
    )
    return State(state), fence, owner


# -- a. the postmaster is killed while workers claim and complete ------------------------------

#: Ground truth, written in the same transaction as every claim and settlement, so it survives
#: the crash exactly when the change it records does.
AUDIT = """
CREATE TABLE claim_log (
    tenant_id text, operation_id text, fence bigint, owner text,
    claimed_at timestamptz, lease_expires_at timestamptz
);
CREATE TABLE settle_log (tenant_id text, operation_id text, fence bigint, state text);
CREATE FUNCTION audit_work_item() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.attempts IS DISTINCT FROM OLD.attempts OR NEW.fence IS DISTINCT FROM OLD.fence THEN
        INSERT INTO claim_log VALUES (NEW.tenant_id, NEW.operation_id, NEW.fence,
                                      NEW.lease_owner, NEW.claimed_at, NEW.lease_expires_at);
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state AND NEW.state <> 'claimed' THEN
        INSERT INTO settle_log VALUES (NEW.tenant_id, NEW.operation_id, NEW.fence, NEW.state);
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER work_item_audit AFTER UPDATE ON work_item
    FOR EACH ROW EXECUTE FUNCTION audit_work_item();
"""

ROWS = 300
WORKERS = 4
BATCH = 5
TENANTS = ("tenant-aa31", "tenant-bb52", "tenant-cc73")


@dataclass(frozen=True, slots=True)
class Seen:
    """A claim as a worker believed it got it: ``owner`` names the one claim call."""

    key: Key
    fence: int
    owner: str


@dataclass(frozen=True, slots=True)
class Attempt:
    """One complete() call: ``ok``, ``lease_lost`` or ``unavailable`` (with outcome_unknown)."""

    ticket: Ticket
    outcome: str
    outcome_unknown: bool = False
    #: an earlier call for the same ticket failed with an unknown outcome
    after_unknown: bool = False


class Workers:
    """Worker threads looping claim -> complete, recording everything they believed."""

    def __init__(self, store: PostgresStore, count: int) -> None:
        self._store = store
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.claims: list[Seen] = []
        self.attempts: list[Attempt] = []
        self.failures: list[tuple[int, float, StoreUnavailable]] = []
        self.unexpected: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._run, args=(i,), name=f"worker-{i}", daemon=True)
            for i in range(count)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> list[str]:
        """Stop and join; returns the names of threads that did not finish (hung)."""
        self._stop.set()
        deadline = time.monotonic() + DEADLINE
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self._threads if t.is_alive()]

    def successes(self) -> int:
        with self._lock:
            return sum(a.outcome == "ok" for a in self.attempts)

    def failed_since(self, moment: float) -> set[int]:
        with self._lock:
            return {index for index, at, _ in self.failures if at > moment}

    def _failed(self, index: int, exc: StoreUnavailable) -> None:
        with self._lock:
            self.failures.append((index, time.monotonic(), exc))

    def _run(self, index: int) -> None:
        rng = random.Random(index)
        calls = 0
        try:
            while not self._stop.is_set():
                calls += 1
                owner = f"w{index}-{calls}"
                try:
                    claims = self._store.claims.claim(owner, BATCH, LEASE)
                except StoreUnavailable as exc:
                    self._failed(index, exc)
                    self._stop.wait(rng.uniform(0.02, 0.1))
                    continue
                with self._lock:
                    self.claims.extend(Seen(c.key, c.fence, owner) for c in claims)
                if not claims:
                    self._stop.wait(0.05)
                for claim in claims:
                    time.sleep(rng.uniform(0.0, 0.01))  # the handler's work
                    self._complete(index, claim.ticket, rng)
        except BaseException as exc:  # noqa: BLE001  (anything else fails the test)
            with self._lock:
                self.unexpected.append(exc)

    def _complete(self, index: int, ticket: Ticket, rng: random.Random) -> None:
        """Complete under the fence; retry only while the store is unavailable.

        Retrying the same fenced write is safe: it succeeds only while this fence still holds
        the row in ``claimed``, so a write that did land turns the retry into LeaseLost.
        """
        unknown = False
        while True:
            try:
                self._store.settle.settle(Settlement(ticket, State.SUCCEEDED, "ok"))
            except LeaseLost:
                attempt = Attempt(ticket, "lease_lost", after_unknown=unknown)
            except StoreUnavailable as exc:
                self._failed(index, exc)
                with self._lock:
                    self.attempts.append(
                        Attempt(ticket, "unavailable", exc.outcome_unknown, after_unknown=unknown)
                    )
                unknown = unknown or exc.outcome_unknown
                if self._stop.wait(rng.uniform(0.02, 0.1)):
                    return
                continue
            else:
                attempt = Attempt(ticket, "ok", after_unknown=unknown)
            with self._lock:
                self.attempts.append(attempt)
            return


@pytest.mark.slow
def test_postmaster_killed_mid_claim_no_double_claim_no_lost_row(
    cluster: Cluster, cluster_db_url: str
) -> None:
    url = cluster_db_url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(AUDIT)
    keys = [Key(TENANTS[i % len(TENANTS)], f"refund-{i:04d}") for i in range(ROWS)]
    store = open_store(url, max_size=WORKERS + 2)
    try:
        store.inbox.ingest([delivery(k.tenant_id, k.operation_id) for k in keys])
        workers = Workers(store, WORKERS)
        workers.start()
        try:
            wait_for("a third of the rows to settle", lambda: workers.successes() >= ROWS // 3)
            killed_at = time.monotonic()
            cluster.kill()
            unsettled_at_crash = ROWS - workers.successes()
            wait_for(
                "every worker to see the database down",
                lambda: workers.failed_since(killed_at) == set(range(WORKERS)),
            )
            # Stay down past a whole lease: every lease granted before the crash has expired
            # when the database comes back, so takeovers and stale completes race for real.
            time.sleep(max(0.0, killed_at + LEASE.total_seconds() + 0.5 - time.monotonic()))
            cluster.restart()
            wait_for(
                "every row to settle after the restart",
                lambda: not fetch(url, "SELECT 1 FROM work_item WHERE state <> 'succeeded'"),
                timeout=DEADLINE * 2,
                interval=0.1,
            )
        finally:
            hung = workers.stop()
    finally:
        store.close()

    assert hung == []
    assert workers.unexpected == []
    assert unsettled_at_crash > 0, "the crash came after the work was done"
    assert workers.failures, "the crash was never felt"
    assert all(isinstance(exc, TransientError) for _, _, exc in workers.failures)

    # No row lost: every operation succeeded.
    final = {
        Key(t, o): (s, f)
        for t, o, s, f in fetch(url, "SELECT tenant_id, operation_id, state, fence FROM work_item")
    }
    assert set(final) == set(keys)
    assert {s for s, _ in final.values()} == {State.SUCCEEDED.value}

    # No (key, fence) handed to two claim calls, and the database agrees who got each one.
    seen = Counter((c.key, c.fence) for c in workers.claims)
    assert [pair for pair, n in seen.items() if n > 1] == []
    log = fetch(
        url,
        "SELECT tenant_id, operation_id, fence, owner, claimed_at, lease_expires_at"
        " FROM claim_log ORDER BY claimed_at, fence",
    )
    granted = Counter((Key(t, o), f) for t, o, f, *_ in log)
    assert [pair for pair, n in granted.items() if n > 1] == []
    owner_of = {(Key(t, o), f): owner for t, o, f, owner, *_ in log}
    assert {(c.key, c.fence): c.owner for c in workers.claims}.items() <= owner_of.items()

    # Per row, in the database's order of claims: fence 1, 2, 3, ... and a later claim only
    # after the earlier lease expired. A claim whose reply was lost with the crash (nobody
    # held it) was taken over by a later claim.
    history: dict[Key, list[tuple[int, str, datetime, datetime]]] = defaultdict(list)
    for t, o, f, owner, claimed_at, expires in log:
        history[Key(t, o)].append((f, owner, claimed_at, expires))
    held = {(c.key, c.fence) for c in workers.claims}
    for key, claims in history.items():
        assert [f for f, *_ in claims] == list(range(1, len(claims) + 1)), key
        for (_, _, _, expires), (_, _, claimed_at, _) in itertools.pairwise(claims):
            assert claimed_at > expires, key
        for f, *_ in claims:
            if (key, f) not in held:
                assert f < len(claims), f"lost claim {key} fence {f} was never taken over"
        assert final[key][1] == len(claims)

    # Exactly one settlement per row, under its last fence, by a claim a worker held.
    settles = fetch(url, "SELECT tenant_id, operation_id, fence, state FROM settle_log")
    assert Counter(Key(t, o) for t, o, *_ in settles) == Counter(keys)
    winner = {Key(t, o): f for t, o, f, _ in settles}
    assert {s for *_, s in settles} == {State.SUCCEEDED.value}
    assert all(winner[k] == final[k][1] and (k, winner[k]) in held for k in keys)

    # What the workers were told agrees: at most one success per row, under the winning fence;
    # LeaseLost only for a stale fence or for a retry after the write had landed unseen.
    by_key: dict[Key, list[Attempt]] = defaultdict(list)
    for a in workers.attempts:
        by_key[a.ticket.key].append(a)
    for key in keys:
        attempts = by_key[key]
        ok = [a for a in attempts if a.outcome == "ok"]
        assert len(ok) <= 1, key
        if ok:
            assert ok[0].ticket.fence == winner[key]
        else:  # the successful write's reply was lost: its caller saw an unknown outcome
            assert any(a.outcome_unknown and a.ticket.fence == winner[key] for a in attempts), key
        for a in attempts:
            if a.outcome == "lease_lost":
                stale = a.ticket.fence < winner[key]
                assert stale or a.after_unknown, (key, a)


# -- b. the connection is cut while a statement is inside the server ---------------------------


class Call(Generic[T]):
    """A store call on its own thread, so the test can cut the network under it."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._result: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], T]) -> None:
        try:
            self._result = fn()
        except BaseException as exc:  # noqa: BLE001  (handed to the test)
            self._error = exc

    def error(self) -> BaseException:
        """The exception the call ended with (the call must end: a hang fails the test)."""
        self._thread.join(DEADLINE)
        assert not self._thread.is_alive(), "the store call hung"
        assert self._error is not None, f"the call returned {self._result!r}"
        return self._error


def through(proxy: Proxy, url: str) -> str:
    return conninfo.make_conninfo(url, host=proxy.host, port=str(proxy.port))


def waiting_backend(url: str) -> int | None:
    """The pid of the store's backend that is waiting on a lock, if any."""
    rows = fetch(
        url,
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = %s AND wait_event_type = 'Lock'",
        (APPLICATION_NAME,),
    )
    return rows[0][0] if rows else None


def backend_gone(url: str, pid: int) -> bool:
    return not fetch(url, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))


@contextmanager
def holding(url: str, statement: str, params: Any = None) -> Iterator[None]:
    """Hold the locks ``statement`` takes, in an open transaction, until the block ends."""
    with psycopg.connect(url) as holder:
        holder.execute(statement, params)
        try:
            yield
        finally:
            holder.rollback()


def cut_in_flight(
    url: str, proxy: Proxy, call: Callable[[], object], lock: str, params: Any = None
) -> tuple[StoreUnavailable, int]:
    """Run ``call`` while ``lock`` blocks it inside the server, then cut the proxy.

    Returns the caller's error and the pid of the orphaned backend, whose statement goes on
    (and commits) once the lock is released.
    """
    with holding(url, lock, params):
        pending = Call(call)
        pid = wait_for("the store's statement to block on the lock", lambda: waiting_backend(url))
        proxy.stop()
        error = pending.error()
        assert isinstance(error, StoreUnavailable), repr(error)
        return error, pid


def recovered(call: Callable[[], T]) -> Callable[[], T | None]:
    """``call`` for wait_for: None while the store is still unavailable."""

    def attempt() -> T | None:
        try:
            return call()
        except StoreUnavailable:
            return None

    return attempt


LOCK_TABLE = "LOCK TABLE work_item IN ACCESS EXCLUSIVE MODE"
LOCK_ROW = "SELECT 1 FROM work_item WHERE tenant_id = %s AND operation_id = %s FOR UPDATE"
KEY = Key("tenant-d41c", "refund-77e0")
KEY_PARAMS = (KEY.tenant_id, KEY.operation_id)


@pytest.mark.slow
def test_claim_cut_in_flight_is_outcome_unknown_and_its_lease_is_taken_over(
    cluster_db_url: str, proxy: Proxy
) -> None:
    url = cluster_db_url
    store = open_store(through(proxy, url))
    try:
        store.inbox.ingest([delivery(KEY.tenant_id, KEY.operation_id)])
        error, pid = cut_in_flight(
            url, proxy, lambda: store.claims.claim("lost", 10, LEASE), LOCK_TABLE
        )
        assert error.outcome_unknown

        # The statement was inside the server: released, it commits, and nobody holds the lease.
        wait_for("the orphaned backend to finish", lambda: backend_gone(url, pid))
        assert row_state(url, KEY) == (State.CLAIMED, 1, "lost")
        [(first_expiry,)] = fetch(url, "SELECT lease_expires_at FROM work_item")

        proxy.start()
        # The same store works again; once the lost lease expires, a claim takes the row over.
        [claim] = wait_for(
            "a takeover claim", recovered(lambda: store.claims.claim("next", 10, LEASE))
        )
        assert (claim.key, claim.fence, claim.attempts, claim.takeover) == (KEY, 2, 2, True)
        assert claim.lease_expires_at - LEASE > first_expiry
        store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
        assert row_state(url, KEY) == (State.SUCCEEDED, 2, None)
    finally:
        store.close()


def test_complete_cut_in_flight_that_landed_is_never_applied_twice(
    cluster_db_url: str, proxy: Proxy
) -> None:
    url = cluster_db_url
    store = open_store(through(proxy, url))
    try:
        store.inbox.ingest([delivery(KEY.tenant_id, KEY.operation_id)])
        [claim] = store.claims.claim("w", 10, LEASE)
        error, pid = cut_in_flight(
            url,
            proxy,
            lambda: store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok")),
            LOCK_ROW,
            KEY_PARAMS,
        )
        assert error.outcome_unknown
        wait_for("the orphaned backend to finish", lambda: backend_gone(url, pid))
        assert row_state(url, KEY) == (State.SUCCEEDED, 1, None)
        [(settled_at,)] = fetch(url, "SELECT settled_at FROM work_item")

        proxy.start()
        # Retrying the same fenced write cannot succeed a second time.
        lost = wait_for("the retried complete", recovered(lambda: retry_complete(store, claim)))
        assert isinstance(lost, LeaseLost)
        assert fetch(url, "SELECT state, fence, settled_at FROM work_item") == [
            (State.SUCCEEDED.value, 1, settled_at)
        ]
    finally:
        store.close()


def test_complete_cut_in_flight_that_never_ran_succeeds_once_on_retry(
    cluster_db_url: str, proxy: Proxy
) -> None:
    url = cluster_db_url
    store = open_store(through(proxy, url))
    try:
        store.inbox.ingest([delivery(KEY.tenant_id, KEY.operation_id)])
        [claim] = store.claims.claim("w", 10, LEASE)
        with holding(url, LOCK_ROW, KEY_PARAMS):
            pending = Call(
                lambda: store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
            )
            pid = wait_for("the complete to block on the row lock", lambda: waiting_backend(url))
            proxy.stop()
            error = pending.error()
            # The server loses the statement before it runs (its session ends while waiting).
            fetch(url, "SELECT pg_terminate_backend(%s)", (pid,))
            wait_for("the backend to end", lambda: backend_gone(url, pid))
        assert isinstance(error, StoreUnavailable)
        assert error.outcome_unknown
        assert row_state(url, KEY) == (State.CLAIMED, 1, "w")

        proxy.start()
        done = wait_for("the retried complete", recovered(lambda: retry_complete(store, claim)))
        assert done is True
        assert isinstance(retry_complete(store, claim), LeaseLost)
        assert fetch(url, "SELECT count(*) FROM work_item WHERE state = 'succeeded'") == [(1,)]
    finally:
        store.close()


def retry_complete(store: PostgresStore, claim: Claim) -> bool | LeaseLost:
    """True when the complete applied now, the LeaseLost when the fence no longer holds."""
    try:
        store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
    except LeaseLost as lost:
        return lost
    return True


@pytest.mark.slow
def test_calls_while_the_connection_is_down_fail_fast_and_the_store_recovers(
    cluster_db_url: str, proxy: Proxy
) -> None:
    url = cluster_db_url
    store = open_store(through(proxy, url))
    try:
        store.inbox.ingest([delivery(KEY.tenant_id, KEY.operation_id)])
        wait_for("the pool to connect through the proxy", lambda: proxy.open_connections)
        proxy.stop()

        # The pool's cut connections fail first (it cannot know what the server saw); then no
        # connection can be made and the error says nothing was sent. No call hangs.
        until_unreachable(lambda: store.claims.claim("down", 10, LEASE))
        assert row_state(url, KEY) == (State.QUEUED, 0, None)

        proxy.start()
        wait_for("the same store to work again", recovered(store.operator.stats))
        [claim] = store.claims.claim("back", 10, LEASE)
        assert (claim.key, claim.fence, claim.takeover) == (KEY, 1, False)
    finally:
        store.close()


def until_unreachable(call: Callable[[], object]) -> list[StoreUnavailable]:
    """Call while the database is unreachable until the error says nothing was sent.

    Every call must end (no hang) in StoreUnavailable; returns the errors in order.
    """
    errors: list[StoreUnavailable] = []

    def one() -> bool:
        error = Call(call).error()
        assert isinstance(error, StoreUnavailable), repr(error)
        errors.append(error)
        return not error.outcome_unknown

    wait_for("a call that could not reach the database at all", one)
    return errors


def test_a_statement_the_server_cancelled_is_known_not_applied(cluster_db_url: str) -> None:
    """An error the server reports on a live connection decided the outcome: nothing applied."""
    url = cluster_db_url
    store = open_store(url)
    try:
        store.inbox.ingest([delivery(KEY.tenant_id, KEY.operation_id)])
        [claim] = store.claims.claim("w", 10, LEASE)
        with holding(url, LOCK_ROW, KEY_PARAMS):
            pending = Call(
                lambda: store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok"))
            )
            pid = wait_for("the complete to block on the row lock", lambda: waiting_backend(url))
            fetch(url, "SELECT pg_cancel_backend(%s)", (pid,))  # as statement_timeout would
            error = pending.error()
        assert isinstance(error, StoreUnavailable)
        assert not error.outcome_unknown
        assert row_state(url, KEY) == (State.CLAIMED, 1, "w")
        store.settle.settle(
            Settlement(claim.ticket, State.SUCCEEDED, "ok")
        )  # the same connection pool, the same fence: now it lands
        assert row_state(url, KEY) == (State.SUCCEEDED, 1, None)
    finally:
        store.close()


# -- c. the error a caller gets is actionable ----------------------------------------------------


@pytest.mark.slow
def test_store_unavailable_says_the_database_is_unavailable_without_identifiers(
    cluster: Cluster, cluster_db_url: str, proxy: Proxy
) -> None:
    url = cluster_db_url
    store = open_store(through(proxy, url))
    errors: list[StoreUnavailable] = []
    try:
        store.inbox.ingest([delivery(KEY.tenant_id, KEY.operation_id)])
        [claim] = store.claims.claim("w", 10, LEASE)

        # Cut mid-statement.
        error, _ = cut_in_flight(
            url,
            proxy,
            lambda: store.settle.settle(Settlement(claim.ticket, State.SUCCEEDED, "ok")),
            LOCK_ROW,
            KEY_PARAMS,
        )
        errors.append(error)
        # Unreachable: the cut connection, then no connection at all.
        errors += until_unreachable(lambda: store.settle.heartbeat(claim.ticket, LEASE))
        # The server crashed under an established connection.
        proxy.start()
        wait_for("the store to reconnect", recovered(store.operator.stats))
        cluster.kill()
        try:
            failed = Call(lambda: store.settle.heartbeat(claim.ticket, LEASE)).error()
        finally:
            cluster.restart()
        assert isinstance(failed, StoreUnavailable)
        errors.append(failed)
    finally:
        store.close()

    assert len(errors) >= 3
    for exc in errors:
        message = str(exc)
        assert "database unavailable" in message, message
        assert KEY.tenant_id not in message, message
        assert KEY.operation_id not in message, message


def test_a_data_error_names_its_sqlstate_without_repeating_the_value(db_url: str) -> None:
    """The server quotes a value it could not take; that text never reaches our error."""
    conn = connect(db_url)
    try:
        with pytest.raises(StoreError) as caught, translate_errors("probe"):
            conn.execute("SELECT %s::bigint", ("tenant-7f3a",))
    finally:
        conn.close()
    message = str(caught.value)
    assert "tenant-7f3a" not in message
    assert message == "probe: InvalidTextRepresentation (SQLSTATE 22P02)"
