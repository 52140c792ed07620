SELECT version, name, checksum FROM fencebridge_migration ORDER BY version
