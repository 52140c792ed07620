-- Other fencebridge sessions on this database (a bridge, a console, a command): a reset while
-- one runs would leave it hashing under the replaced key.
SELECT count(*)
  FROM pg_stat_activity
 WHERE datname = current_database()
   AND application_name = 'fencebridge'
   AND pid <> pg_backend_pid()
