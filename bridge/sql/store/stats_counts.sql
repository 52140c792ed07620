-- Row counts by subscription, tenant and state.
SELECT subscription, tenant_id, state, count(*) AS n
  FROM work_item
 GROUP BY subscription, tenant_id, state
 ORDER BY subscription, tenant_id, state
