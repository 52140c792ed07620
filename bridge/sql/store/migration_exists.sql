SELECT to_regclass('fencebridge_migration') IS NOT NULL
