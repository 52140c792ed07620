"""Ordering keys closed behind a message that left unwritten (``consumers.pubsub.ordering``).

The emulator test (``acceptance/test_pubsub_ordered.py``) drives the same barriers through two
bridges; here the clock is the test's.
"""

from __future__ import annotations

from dataclasses import dataclass

from consumers.pubsub.ordering import KeyBarriers


@dataclass(frozen=True, slots=True)
class Message:
    message_id: str
    ordering_key: str | None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_key_waits_for_its_message_that_left_unwritten_and_other_keys_do_not() -> None:
    clock = Clock()
    barriers = KeyBarriers(clock)
    k1, k2, k3 = Message("1", "k"), Message("2", "k"), Message("3", "k")
    other, unkeyed = Message("4", "j"), Message("5", None)
    barriers.left_unwritten([k1, unkeyed], ttl=70.0)
    assert len(barriers) == 1  # unkeyed messages have no order to keep
    write, back = barriers.sort([k2, other, unkeyed])
    assert (write, back) == ([other, unkeyed], [k2])
    # Later messages let go too leave the key waiting for the first one.
    barriers.left_unwritten([k2], ttl=70.0)
    assert barriers.sort([k3]) == ([], [k3])
    # Its return opens the key.
    assert barriers.sort([k1]) == ([k1], [])
    assert barriers.sort([k2, k3]) == ([k2, k3], [])


def test_a_key_opens_again_once_its_wait_ran_out() -> None:
    """The message may have come back to another replica, which wrote it."""
    clock = Clock()
    barriers = KeyBarriers(clock)
    barriers.left_unwritten([Message("1", "k")], ttl=70.0)
    assert barriers.sort([Message("2", "k")])[1]
    clock.now += 70.0
    assert barriers.sort([Message("2", "k")]) == ([Message("2", "k")], [])
    assert len(barriers) == 0
