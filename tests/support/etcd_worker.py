"""One class B worker on etcd as a real process, driven like :mod:`tests.support.worker_process`.

Run as ``python -m tests.support.etcd_worker --database-url URL --etcd-url URL --tenant T
--operation OP [--gate POINT ...]``. It claims the one key, runs
:func:`bridge.executors.execute` with :class:`SetValueInEtcd` and reports on stdout with the same
lines (``claimed …``, ``at claimed``, ``at handler``, ``at effect``, ``result {…}``), waiting for
``go`` on stdin at every gated point. It runs no heartbeat: only etcd's own compare stands
between a paused worker and the key.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from datetime import timedelta

from bridge.events import EventCounter
from bridge.executors import Run, execute
from bridge.executors.registry import Registry
from bridge.handlers import ConditionalWriteHandler, Context, Quarantine, Success
from bridge.identity import IdentityHasher
from bridge.store import PostgresStore
from bridge.targets.etcd import EtcdClient, fenced_put
from bridge.types import Key
from tests.support.worker_process import POINTS, REPO, Gates, WorkerProcess, context_for, say

JOB_TYPE = "set_etcd_value"


def etcd_key(tenant_id: str, operation_id: str) -> bytes:
    """The record this job writes: one key per operation, as class B requires."""
    return f"fencebridge-test/values/{tenant_id}/{operation_id}".encode()


class SetValueInEtcd(ConditionalWriteHandler):
    """Sets the operation's key to the payload's ``value`` and the fence of the claim writing it."""

    def __init__(self, client: EtcdClient) -> None:
        self._client = client

    def handle(self, ctx: Context) -> Success:
        data = ctx.json()
        value = data.get("value") if isinstance(data, dict) else None
        if not isinstance(value, str):
            raise Quarantine("invalid_payload", "value must be a string")
        record = json.dumps({"value": value, "fence": ctx.fence})
        fenced_put(self._client, etcd_key(ctx.tenant_id, ctx.operation_id), record, ctx)
        return Success("value_set")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.support.etcd_worker")
    p.add_argument("--database-url", required=True)
    p.add_argument("--etcd-url", required=True)
    p.add_argument("--tenant", required=True)
    p.add_argument("--operation", required=True)
    p.add_argument("--lease", type=float, default=1.0, help="lease in seconds")
    p.add_argument("--gate", action="append", default=[], choices=POINTS)
    args = p.parse_args(argv)
    gates = Gates(args.gate)

    class GatedSetValue(SetValueInEtcd):
        def handle(self, ctx: Context) -> Success:
            gates.reach("handler")
            result = super().handle(ctx)
            gates.reach("effect")
            return result

    store = PostgresStore.connect(args.database_url, min_size=1, max_size=2)
    try:
        spec = Registry().register(
            JOB_TYPE,
            GatedSetValue(EtcdClient(args.etcd_url)),
            lease=timedelta(seconds=args.lease),
        )
        claims = store.claims.claim_keys(
            f"etcd-worker-{os.getpid()}", [Key(args.tenant, args.operation)], spec.lease
        )
        if not claims:
            say("claimed none")
            return 0
        (claim,) = claims
        takeover = "true" if claim.takeover else "false"
        say(f"claimed fence={claim.fence} attempts={claim.attempts} takeover={takeover}")
        gates.reach("claimed")
        events = EventCounter()
        execute(
            Run(store.settle, claim, spec, context_for(claim, IdentityHasher.from_env()), events)
        )
        say("result " + json.dumps(events.snapshot(), sort_keys=True))
    finally:
        store.close()
    return 0


class EtcdWorkerProcess(WorkerProcess):
    """A started etcd worker; the reading and the controls are :class:`WorkerProcess`'s."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str]) -> None:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115  (closed in close())
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.etcd_worker", *args],
            cwd=REPO,
            env={**os.environ, **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        self._buffer = b""
        self.lines = []


if __name__ == "__main__":
    raise SystemExit(main())
