-- Forget what one shadow subscription recorded (a comparison that is over).
WITH ops AS (
    DELETE FROM shadow_operation WHERE subscription = %(subscription)s RETURNING 1
),
deliveries AS (
    DELETE FROM shadow_delivery WHERE subscription = %(subscription)s RETURNING 1
)
SELECT (SELECT count(*) FROM ops), (SELECT count(*) FROM deliveries)
