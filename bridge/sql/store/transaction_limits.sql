-- Narrow (or lift) the session's limits for the rest of this transaction only (SET LOCAL):
-- a class A transaction runs under its handler's deadline, an erasure under no statement limit.
-- A NULL keeps the session's setting. Values are milliseconds, '0' means no limit.
SELECT set_config('statement_timeout',
                  coalesce(%(statement_timeout)s::text, current_setting('statement_timeout')),
                  true),
       set_config('idle_in_transaction_session_timeout',
                  coalesce(%(idle_timeout)s::text,
                           current_setting('idle_in_transaction_session_timeout')),
                  true)
