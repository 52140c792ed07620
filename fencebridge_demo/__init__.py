"""The runnable demonstration: a local payment provider and the scenario that drives it.

A package of its own beside the bridge, shipped in the same distribution: it imports the
bridge, the bridge never imports it. ``fencebridge demo`` (:mod:`fencebridge_demo.command`) is
found by the command line through the ``fencebridge.commands`` entry point group.
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
