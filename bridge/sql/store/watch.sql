-- Where the given operations stand, for consumers holding deliveries until the outcome
-- (ack mode after_outcome): the state, and whether a claim's lease is still being renewed.
SELECT w.tenant_id, w.operation_id, w.state,
       (w.state = 'claimed' AND w.lease_expires_at >= coalesce(%(now)s::timestamptz, now()))
           AS lease_live
  FROM unnest(%(tenant_id)s::text[], %(operation_id)s::text[]) AS k(tenant_id, operation_id)
  JOIN work_item w USING (tenant_id, operation_id)
