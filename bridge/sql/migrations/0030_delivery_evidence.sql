-- Delivery evidence per operation: every copy of its delivery that arrived after the first with
-- the same payload (a replay), one row each, appended by the inbox in the transaction that
-- decides it. The first copy's arrival is the work row's created_at; conflicting copies are in
-- rejected_delivery. Read by `fencebridge inspect` and the console's operation page, counted
-- on read. Appended, never updated: the work row a worker holds is not written (its foreign key
-- takes a key-share lock only, which a claim's or a settlement's update does not wait for). The
-- foreign key cascades, so an erasure or a purge removes the copies with their row.
-- The key leads with the operation, so the count on read and the cascade find its copies by
-- its index (a new table: nothing to build concurrently).
CREATE TABLE delivery_copy (
    tenant_id    text        NOT NULL,
    operation_id text        NOT NULL,
    id           bigint      GENERATED ALWAYS AS IDENTITY,
    arrived_at   timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, operation_id, id),
    FOREIGN KEY (tenant_id, operation_id) REFERENCES work_item (tenant_id, operation_id)
        ON DELETE CASCADE
);
