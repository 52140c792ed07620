-- Refund a paid invoice. The status guard is defence in depth: even if fencing were broken, a
-- second refund of the same invoice would find it no longer 'paid' and change nothing.
UPDATE demo_invoice
   SET status = 'refunded',
       refunded_fence = %(fence)s,
       refund_operation_id = %(operation_id)s,
       refunded_at = now()
 WHERE tenant_id = %(tenant_id)s
   AND invoice_id = %(invoice_id)s
   AND status = 'paid'
RETURNING refunded_fence
