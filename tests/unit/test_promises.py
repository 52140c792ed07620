"""The promises' list is the one the docs show (docs/operations.md, "Promises")."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.promises import rendered

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
BLOCK = re.compile(r"<!-- promises:start -->\n(.*?)\n<!-- promises:end -->", re.DOTALL)


def test_the_docs_show_the_list_of_promises() -> None:
    found = BLOCK.search(DOC.read_text(encoding="utf-8"))
    assert found is not None, "docs/operations.md has no promises block"
    assert found.group(1) == rendered(), (
        "docs/operations.md's promises differ from tests/support/promises.py: paste "
        "`python -c 'from tests.support.promises import rendered; print(rendered())'`"
    )
