-- Whether a standby has flushed the WAL up to %(lsn)s, and how many stream at all. Reading a
-- standby's positions in pg_stat_replication takes pg_read_all_stats (infra/postgres/roles.sql
-- grants it to the bridge); without it they read NULL and no wait is ever confirmed.
SELECT count(*) FILTER (WHERE flush_lsn >= %(lsn)s::pg_lsn), count(*)
  FROM pg_stat_replication
