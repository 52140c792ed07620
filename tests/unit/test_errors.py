"""The error tree drawn in ``bridge/errors.py`` is the tree of classes: every error fencebridge
raises is defined there, under the parent the drawing gives it, and nothing else is."""

from __future__ import annotations

import importlib
import pkgutil
import re

import bridge
import consumers
from bridge import errors
from bridge.errors import FenceBridgeError

#: one row of the drawing: its depth (by the column the name starts at) and the name
ROW = re.compile(r"^    (?P<lead>[│├└─ ]*)(?P<name>[A-Z]\w+)\s")


def drawn() -> dict[str, str | None]:
    """Each class the drawing names, with the class it hangs under."""
    assert errors.__doc__ is not None
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in errors.__doc__.splitlines():
        found = ROW.match(line)
        if found is None:
            continue
        depth = len(found["lead"])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[found["name"]] = stack[-1][1] if stack else None
        stack.append((depth, found["name"]))
    return parents


def defined() -> dict[str, str | None]:
    """Each subclass of FenceBridgeError in the product, with its fencebridge parent."""
    for package in (bridge, consumers):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if not module.name.startswith("bridge.demo") and not module.name.endswith("__main__"):
                importlib.import_module(module.name)
    found: dict[str, str | None] = {FenceBridgeError.__name__: None}
    todo = [FenceBridgeError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            found[sub.__name__] = next(
                b.__name__ for b in sub.__bases__ if issubclass(b, FenceBridgeError)
            )
            todo.append(sub)
    return found


def test_the_drawing_is_the_class_tree() -> None:
    assert drawn() == defined()


def test_every_error_is_defined_in_the_errors_module() -> None:
    defined()
    elsewhere = {
        f"{cls.__module__}.{cls.__name__}"
        for cls in _all(FenceBridgeError)
        if cls.__module__ != errors.__name__
    }
    assert elsewhere == set()


def _all(cls: type[FenceBridgeError]) -> list[type[FenceBridgeError]]:
    subs = cls.__subclasses__()
    return subs + [s for sub in subs for s in _all(sub)]
