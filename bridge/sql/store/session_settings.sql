-- The limits a new session of the bridge runs under, in milliseconds, to compare with the ones
-- it asked for in its startup options (bridge/store/session_check.py).
SELECT (extract(epoch FROM current_setting('statement_timeout')::interval) * 1000)::bigint,
       (extract(epoch FROM current_setting('lock_timeout')::interval) * 1000)::bigint,
       (extract(epoch FROM current_setting('idle_in_transaction_session_timeout')::interval)
        * 1000)::bigint
