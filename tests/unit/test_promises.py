"""The promises' list is the one the docs show (docs/operations.md, "Promises")."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import check_promises
from tests.support.promises import PROMISES, rendered

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
BLOCK = re.compile(r"<!-- promises:start -->\n(.*?)\n<!-- promises:end -->", re.DOTALL)


def test_the_docs_show_the_list_of_promises() -> None:
    found = BLOCK.search(DOC.read_text(encoding="utf-8"))
    assert found is not None, "docs/operations.md has no promises block"
    assert found.group(1) == rendered(), (
        "docs/operations.md's promises differ from tests/support/promises.py: paste "
        "`python -c 'from tests.support.promises import rendered; print(rendered())'`"
    )


class Item:
    """As much of a collected test as the check reads: its node id and its markers."""

    def __init__(self, *marks: pytest.Mark) -> None:
        self.nodeid = "tests/x.py::test_x"
        self.marks = marks

    def iter_markers(self, name: str) -> list[pytest.Mark]:
        return [m for m in self.marks if m.name == name]

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return next(iter(self.iter_markers(name)), None)


def marked(name: str, *args: str) -> pytest.Mark:
    decorator = getattr(pytest.mark, name)
    mark: pytest.Mark = (decorator(*args) if args else decorator).mark
    return mark


def whole_suite(request: pytest.FixtureRequest) -> Any:
    return SimpleNamespace(rootpath=request.config.rootpath, args=["tests"])


def test_the_whole_suite_refuses_to_run_with_a_promise_only_slow_tests_guard(
    request: pytest.FixtureRequest,
) -> None:
    config = whole_suite(request)
    fast = [Item(marked("promise", p)) for p in PROMISES if p != "worker-fault"]
    with pytest.raises(pytest.UsageError, match="without a fast-tier test: worker-fault"):
        check_promises(config, [*fast, Item(marked("promise", "worker-fault"), marked("slow"))])
    check_promises(config, [*fast, Item(marked("promise", "worker-fault"))])
    # a run of a few files is not judged: it never holds every promise's tests
    check_promises(SimpleNamespace(rootpath=config.rootpath, args=["tests/unit"]), fast)


def test_a_promise_marker_must_name_a_listed_promise(request: pytest.FixtureRequest) -> None:
    with pytest.raises(pytest.UsageError, match="names \\['no-such-promise'\\]"):
        check_promises(whole_suite(request), [Item(marked("promise", "no-such-promise"))])
