"""The operator console: a JSON API over the work store, versioned under ``/api/v1``.

It reads what ``fencebridge status`` and ``inspect`` read and acts through the same core code
as ``fencebridge redrive`` (:mod:`bridge.operator.redrive`), so the console and the CLI cannot
disagree on what a redrive does. Every request carries a bearer token, or comes through a
trusted authenticating proxy (:mod:`.auth`); identifiers are shown as keyed hashes only, and
payload bytes only to the payload role, one operation at a time, each view audited.
"""
