-- What a failover can cost (check's control 10): the synchronous standbys the server waits for,
-- its synchronous_commit, the standbys streaming from it, and how many of their positions the
-- session may read (pg_read_all_stats; wait_for_standby needs them).
SELECT current_setting('synchronous_standby_names'),
       current_setting('synchronous_commit'),
       (SELECT count(*) FROM pg_stat_replication),
       (SELECT count(*) FROM pg_stat_replication WHERE flush_lsn IS NOT NULL)
