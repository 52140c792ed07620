-- A new invoice (the demo's and the tests' fixture data).
INSERT INTO demo_invoice (tenant_id, invoice_id, amount, currency, status)
VALUES (%(tenant_id)s, %(invoice_id)s, %(amount)s, %(currency)s, %(status)s)
