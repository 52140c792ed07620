"""The runnable demonstration: a local payment provider and the scenario that drives it."""
