"""Broker adapters (SQS, Pub/Sub). They depend on ``bridge``; ``bridge`` never imports them."""
