"""AWS SQS: the ``sqs`` source (:mod:`.source`) and outbox sink (:mod:`.sink`)."""
