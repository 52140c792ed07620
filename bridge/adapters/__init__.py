"""What a broker adapter author works with: the source and sink contracts, the registry
that finds them, and held deliveries. An adapter imports :mod:`bridge.adapters.kit` alone."""
