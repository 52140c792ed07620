"""The primary-and-standby fixture does what the failover tests rely on."""

from __future__ import annotations

import threading

import psycopg
import pytest

from tests.support.replication import replicated_pair
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow


def test_a_stalled_link_lets_the_promoted_standby_miss_acknowledged_commits() -> None:
    with replicated_pair("async") as pair:
        with psycopg.connect(pair.url(), autocommit=True) as conn:
            conn.execute("CREATE TABLE t (n int PRIMARY KEY)")
            conn.execute("INSERT INTO t SELECT generate_series(1, 10)")
        pair.wait_caught_up()
        pair.stall()
        with psycopg.connect(pair.url(), autocommit=True) as conn:
            for n in range(11, 21):
                conn.execute("INSERT INTO t VALUES (%s)", (n,))  # acknowledged, not replicated
        assert pair.lag_bytes() > 0
        assert pair.timeline() == 1
        pair.kill_primary()
        pair.promote()
        assert pair.timeline() == 2
        with psycopg.connect(pair.url(), autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM t").fetchone()
            assert row == (10,)
            conn.execute("INSERT INTO t VALUES (11)")
        pair.rebuild()
        pair.wait_caught_up()
        assert pair.standby.execute("SELECT count(*) FROM t") == [(11,)]


def test_in_sync_mode_a_commit_the_standby_lacks_is_never_acknowledged() -> None:
    with replicated_pair("sync") as pair:
        with psycopg.connect(pair.url(), autocommit=True) as conn:
            conn.execute("CREATE TABLE t (n int PRIMARY KEY)")
            conn.execute("INSERT INTO t SELECT generate_series(1, 10)")
        pair.stall()
        outcome: list[BaseException | None] = []

        def insert() -> None:
            try:
                with psycopg.connect(pair.url(), autocommit=True) as conn:
                    conn.execute("INSERT INTO t VALUES (11)")
                outcome.append(None)
            except psycopg.Error as exc:
                outcome.append(exc)

        thread = threading.Thread(target=insert)
        thread.start()
        eventually(
            lambda: (
                pair.primary.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
                )
                == [(1,)]
            ),
            "the commit to wait for the standby",
        )
        pair.kill_primary()
        thread.join(30)
        assert len(outcome) == 1
        assert isinstance(outcome[0], psycopg.OperationalError)
        pair.promote()
        assert pair.timeline() == 2
        pair.rebuild()
        pair.wait_caught_up()
        with psycopg.connect(pair.url(), autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (10,)
