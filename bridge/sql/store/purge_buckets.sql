-- Token buckets (migration 0018) that have been full for longer than the purge's age: a full
-- bucket and no row are the same to every claim, so removing one changes nothing. No lock is
-- needed: a claim that spends from the bucket meanwhile moves its full_at ahead, and this
-- DELETE re-checks the row it finds updated (READ COMMITTED) and leaves it; a claim that read
-- it before it was deleted inserts it again, as it would have moved it. Not counted.
DELETE FROM token_bucket b
 USING (SELECT k.job_type, k.tenant_id
          FROM token_bucket k
         WHERE k.full_at < coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval
         LIMIT %(limit)s) o
 WHERE b.job_type = o.job_type
   AND b.tenant_id = o.tenant_id
   AND b.full_at < coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval
