"""The runnable demonstration: a local payment provider and the scenario that drives it.

Shipped with the bridge so that ``fencebridge demo`` runs from an install, and kept out of
the core's import path: it imports the bridge, no other module of the bridge imports it.
``fencebridge demo`` (:mod:`bridge.demo.command`) is found by the command line through the
``fencebridge.commands`` entry point group.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import LiteralString


@cache
def statement(name: str) -> LiteralString:
    """The text of ``sql/<name>.sql``: the demo targets keep their SQL in files too."""
    text: LiteralString = (
        resources.files(__package__).joinpath("sql", f"{name}.sql").read_text("utf-8")
    )
    return text
