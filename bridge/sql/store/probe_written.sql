-- fencebridge check --probe, in its scratch schema only: what the inbox holds of one
-- subscription (work rows and rejected deliveries).
SELECT (SELECT count(*) FROM work_item WHERE subscription = %(subscription)s)
     + (SELECT count(*) FROM rejected_delivery WHERE subscription = %(subscription)s)
