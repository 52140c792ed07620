"""``import bridge`` is the handler author's face: what a team imports to write a handler, and
nothing of the bridge's own rooms (the store, the runtime, the adapters)."""

from __future__ import annotations

import bridge

HANDLER_API = {
    # a base class per target class, and what they share
    "SameDatabaseHandler",
    "ConditionalWriteHandler",
    "IdempotentApiHandler",
    "UnfencedHandler",
    "Handler",
    "RetryPolicy",
    "Context",
    # the outcomes a handler ends in, and a class C lookup's answers
    "Success",
    "TerminalFailure",
    "RetryLater",
    "RateLimited",
    "Ambiguous",
    "Quarantine",
    "Applied",
    "NotApplied",
    "CannotTell",
    # what a handler may meet
    "LeaseLost",
    "FencedOut",
    "OutboxError",
    "Key",
    "TargetClass",
}


def test_the_package_exports_the_handler_api_and_nothing_else() -> None:
    assert set(bridge.__all__) == HANDLER_API
    assert bridge.__all__ == sorted(bridge.__all__)


def test_every_exported_name_is_the_object_its_module_defines() -> None:
    for name in bridge.__all__:
        value = getattr(bridge, name)
        assert value.__name__ == name
        assert value.__module__.startswith("bridge.")


def test_the_base_classes_are_documented_for_their_authors() -> None:
    for name in ("SameDatabaseHandler", "ConditionalWriteHandler", "IdempotentApiHandler"):
        assert getattr(bridge, name).__doc__
    assert bridge.__doc__ is not None
    assert "IdempotentApiHandler" in bridge.__doc__
