"""Behind PgBouncer (Debian's ``pgbouncer``): the bridge refuses to start, and says why.

The bridge bounds every statement, lock wait and idle transaction with startup options, keeps
prepared statements and advisory locks on its sessions, and a claimer keeps one session across
calls. PgBouncer refuses the ``options`` startup parameter in every pool mode; told to ignore
it, it drops the limits silently, and in transaction mode it hands each transaction to any
server session. So ``fencebridge run`` checks one connection before anything starts: refused,
or started without its limits, it stops with the reason instead of running unbounded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.database import SessionTimeouts
from bridge.errors import ConfigError
from bridge.store.session_check import require_session
from tests.support.bridge_process import Job, SqsBridgeConfig, bridge_env, run_to_exit
from tests.support.pgbouncer import pgbouncer

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("pool_mode", ["transaction", "session"])
def test_a_pooler_that_refuses_startup_options_is_refused_with_the_reason(
    db_url: str, pool_mode: str
) -> None:
    with (
        pgbouncer(db_url, pool_mode=pool_mode) as url,
        pytest.raises(ConfigError, match=r"unsupported startup parameter.*not through a"),
    ):
        require_session(url, SessionTimeouts())


def test_a_pooler_that_drops_startup_options_is_refused_with_the_reason(db_url: str) -> None:
    with pgbouncer(db_url, ignore_startup_parameters="options") as url:
        with pytest.raises(ConfigError, match=r"statement_timeout \(30000 ms asked, 0 ms applied"):
            require_session(url, SessionTimeouts())
        require_session(url, SessionTimeouts(statement=None, lock=None, idle_in_transaction=None))


def test_fencebridge_run_behind_pgbouncer_in_transaction_mode_stops_at_start(
    db_url: str, tmp_path: Path
) -> None:
    config = SqsBridgeConfig(
        queue_url="http://127.0.0.1:9/000000000000/none",
        endpoint_url="http://127.0.0.1:9",
        jobs={"ledger": Job("tests.support.handlers:RecordEffect", "A")},
    ).write(tmp_path)
    with pgbouncer(db_url, ignore_startup_parameters="options") as url:
        done = run_to_exit(config, bridge_env(url))
    assert done.returncode != 0
    assert "startup options were dropped" in done.stderr + done.stdout
    assert "not through a pooler" in done.stderr + done.stdout
