-- A reset holds every table a row could be written under the key in, until it commits: what it
-- found empty stays empty, and a bridge or command that starts meanwhile waits, then compares
-- its key with the one the reset recorded.
LOCK TABLE identity_key, work_item, rejected_delivery, erased_operation, shadow_operation,
    shadow_delivery, outbox_message IN SHARE ROW EXCLUSIVE MODE
