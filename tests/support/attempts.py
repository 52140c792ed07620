"""Every row's ended attempts as the history reads them, for tests that check a whole run.

An attempt is recorded in ``work_attempt`` by the statement that ends it, except a first attempt
that succeeded (fence 1, no error class, no finding), which is its row: the history
(``inspect_attempts.sql``) reads it from ``claimed_at``, ``settled_at``, ``lease_owner`` and the
outcome, where no record exists for that fence. This is the same reading for every row at once.
"""

from __future__ import annotations

#: a subquery: tenant_id, operation_id, kind, fence, started_at, ended_at, outcome, outcome_code
ENDED_ATTEMPTS = """
(SELECT a.tenant_id, a.operation_id, a.kind, a.fence, a.started_at, a.ended_at, a.outcome,
        a.outcome_code
   FROM work_attempt a
  WHERE a.ended_at IS NOT NULL
 UNION ALL
 SELECT w.tenant_id, w.operation_id, 'claim', w.fence, w.claimed_at, w.settled_at, w.state,
        w.outcome_code
   FROM work_item w
  WHERE w.state = 'succeeded'
    AND w.fence = 1
    AND w.claimed_at IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM work_attempt a
                     WHERE a.tenant_id = w.tenant_id AND a.operation_id = w.operation_id
                       AND a.kind = 'claim' AND a.fence = 1 AND a.ended_at IS NOT NULL))
"""
