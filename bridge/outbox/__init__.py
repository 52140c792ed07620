"""The transactional outbox: what a class A handler publishes with its business write,
the limits a destination's broker sets, and the relay that sends it after commit."""
