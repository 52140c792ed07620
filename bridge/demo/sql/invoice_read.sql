-- One invoice, as the handler and the tests see it.
SELECT tenant_id, invoice_id, amount, currency, status, refunded_fence, refund_operation_id
  FROM demo_invoice
 WHERE tenant_id = %(tenant_id)s
   AND invoice_id = %(invoice_id)s
