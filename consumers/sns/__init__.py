"""AWS SNS: the ``sns`` outbox sink (:mod:`.sink`)."""
