"""Test-only helpers: database provisioning, fault-injection fixtures and servers."""
