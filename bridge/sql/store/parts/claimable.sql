-- What else makes a row w of work_item claimable, beside its state and due time (claim.sql,
-- claim_fair.sql, claim_limited.sql, claim_keys_locked): written under an identity key this
-- process holds (NULL: any), its (job type, tenant) not waiting out a target's rate limit, and
-- no earlier unsettled row in its ordered group. Continues the WHERE clause that takes it in.
AND (%(identity_keys)s::smallint[] IS NULL OR w.identity_key_id = ANY (%(identity_keys)s::smallint[]))
AND NOT EXISTS (SELECT 1 FROM rate_wait r
                 WHERE r.job_type = w.job_type AND r.tenant_id = w.tenant_id
                   AND r.until > coalesce(%(now)s::timestamptz, now()))
AND (w.ordering_key IS NULL OR NOT EXISTS (
        SELECT 1
          FROM work_item p
         WHERE p.subscription = w.subscription
           AND p.ordering_key = w.ordering_key
           AND p.seq < w.seq
           AND p.state IN ('queued', 'claimed')))
