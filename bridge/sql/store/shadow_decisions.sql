-- What the inbox would have made of a shadow subscription's deliveries, per job type.
SELECT job_type, decision, count(*)
  FROM shadow_delivery
 WHERE subscription = ANY (%(subscription)s::text[])
 GROUP BY job_type, decision
