-- fencebridge check --probe: drop its scratch schema and everything the probe made in it.
-- {schema} is the probe's own fresh name, quoted as an identifier by the probe.
DROP SCHEMA IF EXISTS {schema} CASCADE
