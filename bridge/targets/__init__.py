"""Helpers for class B targets: carry the claim's fence into the target's own conditional write.

The condition must travel *inside* the write request, never as a read before it: the target
compares the fence it stores with the one the write carries and refuses lower ones. A refusal
raises :class:`~bridge.errors.FencedOut`.
"""
