"""From a delivery to a work row: decoding with confidence or quarantine, and the inbox
every consumer writes through."""
