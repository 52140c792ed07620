INSERT INTO fencebridge_migration (version, name, checksum)
VALUES (%(version)s, %(name)s, %(checksum)s)
