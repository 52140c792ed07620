"""Google Cloud Pub/Sub: the ``pubsub`` source (:mod:`.source`) and outbox sink
(:mod:`.sink`)."""
