-- Attempt history: one row per claim of an operation (and one per redrive), written by the same
-- statement that changes the work row, so it can never disagree with it. Bounded per operation
-- (the newest N are kept, trimmed by the claim that adds one) and removed with its row: the
-- foreign key cascades, so purge and erasure, of this release or the one before it, take the
-- history along.
--
-- A new table: nothing existing is rewritten or scanned. Adding the foreign key takes a brief
-- SHARE ROW EXCLUSIVE lock on work_item (the table is empty, nothing is validated), under the
-- migration's lock timeout. The running release does not know the table and writes no history.
CREATE TABLE work_attempt (
    id           bigint      GENERATED ALWAYS AS IDENTITY,
    tenant_id    text        NOT NULL,
    operation_id text        NOT NULL,
    -- claim: an attempt under this fence; redrive: an operator moved the parked row.
    kind         text        NOT NULL CHECK (kind IN ('claim', 'redrive')),
    fence        bigint      NOT NULL,
    -- the lease owner of a claim (a process id, never a tenant or operation identifier)
    worker       text,
    takeover     boolean     NOT NULL DEFAULT false,
    started_at   timestamptz NOT NULL,
    ended_at     timestamptz,
    -- what the attempt ended as: a settled state, queued (retry, release, redrive) or lease_lost
    outcome      text        CHECK (outcome IN ('succeeded', 'failed_terminal', 'unknown',
                                                'quarantined', 'queued', 'released',
                                                'lease_lost')),
    outcome_code text,
    -- the class of the error that ended it, never its text (which may quote a payload)
    error_class  text,
    -- what a lookup by idempotency key found (class C reconcile)
    finding      text        CHECK (finding IN ('applied', 'not_applied', 'cannot_tell')),
    PRIMARY KEY (tenant_id, operation_id, id),
    FOREIGN KEY (tenant_id, operation_id) REFERENCES work_item (tenant_id, operation_id)
        ON DELETE CASCADE,
    CHECK ((ended_at IS NULL) = (outcome IS NULL))
);

ALTER TABLE work_attempt ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON work_attempt
    USING (tenant_id IN (SELECT t.tenant_id FROM tenant_role t WHERE t.role_name = current_user));
