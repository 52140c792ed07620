-- Erase one tenant and record the erasure (by the tenant's keyed hash), in one transaction:
-- see fencebridge_erase_tenant in migrations/0002_operations.sql.
SELECT work_rows, payloads, rejected_deliveries, redrive_audits
  FROM fencebridge_erase_tenant(%(tenant_id)s, %(tenant_hash)s, %(actor)s, %(reason)s)
