-- The takeovers a claim takes first (claim.sql, claim_fair.sql): claimed rows
-- whose lease expired with attempts left, of the claim's job types and identity keys, not
-- waiting out a rate limit, oldest lease first, locked with SKIP LOCKED.
expired AS (
    SELECT tenant_id, operation_id, fence, lease_owner, claimed_at
      FROM work_item
     WHERE state = 'claimed'
       AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
       AND attempts < max_attempts
       AND (%(job_types)s::text[] IS NULL OR job_type = ANY (%(job_types)s::text[]))
       AND (%(identity_keys)s::smallint[] IS NULL OR identity_key_id = ANY (%(identity_keys)s::smallint[]))
       AND NOT EXISTS (SELECT 1 FROM rate_wait r
                        WHERE r.job_type = work_item.job_type AND r.tenant_id = work_item.tenant_id
                          AND r.until > coalesce(%(now)s::timestamptz, now()))
     ORDER BY lease_expires_at, seq
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
