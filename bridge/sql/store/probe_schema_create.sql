-- fencebridge check --probe: the scratch schema its evidence runs in, dropped afterwards.
-- {schema} is a fresh name (fencebridge_probe_<hex>), quoted as an identifier by the probe.
CREATE SCHEMA {schema}
