"""The layout's rules, read from the source: who may import whom, and where SQL lives.

Imports are read with :mod:`ast`, every ``import`` statement counted wherever it stands (at the
top, inside a function, under ``TYPE_CHECKING``): a lazy or type-only import is still a
dependency a reader has to follow.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("bridge", "consumers")

#: a string constant that reads as a SQL statement: a statement keyword first, then what that
#: statement needs next (``SELECT <columns> FROM``, ``INSERT INTO``, ``UPDATE <table> SET``,
#: ``DELETE FROM``, ``WITH <name> AS (``), so prose that begins with "Select" or "Update" is not
#: taken for SQL
SQL_STATEMENT = re.compile(
    r"""^\s*(
        SELECT\s+(DISTINCT\s+)?[\w.*()]+(\s+AS\s+\w+)?(\s*,\s*[\w.*()]+(\s+AS\s+\w+)?)*\s+FROM\s
      | INSERT\s+INTO\s
      | UPDATE\s+\S+\s+SET\s
      | DELETE\s+FROM\s
      | WITH\s+(RECURSIVE\s+)?\w+\s+AS\s*\(
    )""",
    re.IGNORECASE | re.DOTALL | re.VERBOSE,
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    """Every Python module of the packages, by dotted name."""
    return {
        module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))
    }


def is_package(name: str) -> bool:
    return modules()[name].name == "__init__.py"


def imported(name: str) -> Iterator[str]:
    """The modules ``name`` imports: ``from a import b`` is ``a.b`` when ``a.b`` is a module."""
    tree = ast.parse(modules()[name].read_text(), filename=str(modules()[name]))
    here = name if is_package(name) else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                target = f"{base}.{alias.name}"
                yield target if target in modules() else base


@cache
def graph() -> dict[str, frozenset[str]]:
    """Imports among the packages' modules only."""
    return {m: frozenset(t for t in imported(m) if t in modules() and t != m) for m in modules()}


def under(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


def test_the_core_never_imports_an_adapter() -> None:
    offenders = {
        m: sorted(t for t in imported(m) if under(t, "consumers"))
        for m in modules()
        if under(m, "bridge")
    }
    assert {m: ts for m, ts in offenders.items() if ts} == {}


def test_the_core_never_imports_the_demo() -> None:
    """No module of ``bridge`` or ``consumers``, not even to run ``fencebridge demo``: the
    command line finds that command by its entry point (``fencebridge.commands``)."""
    core = [m for m in modules() if not under(m, "bridge.demo")]
    offenders = {m: sorted(t for t in imported(m) if under(t, "bridge.demo")) for m in core}
    assert {m: ts for m, ts in offenders.items() if ts} == {}


#: what an adapter may import of the core: the kit, the words and the errors
ADAPTER_MAY_IMPORT = ("bridge.adapters.kit", "bridge.types", "bridge.errors")
#: the adapter a test writes as a third party would, against the kit alone
MEMORY_ADAPTER = ROOT / "tests" / "support" / "memory_source.py"


def imports_of_file(path: Path) -> set[str]:
    """The absolute ``bridge`` modules a file outside the packages imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return {name for name in found if under(name, "bridge")}


def test_adapters_import_only_the_kit_the_words_and_the_errors() -> None:
    """A broker adapter needs nothing of the core but :mod:`bridge.adapters.kit`: a new broker
    (the memory adapter of the tests, written as a third party would) is its own package."""
    offenders = {
        m: sorted(t for t in imported(m) if under(t, "bridge") and t not in ADAPTER_MAY_IMPORT)
        for m in modules()
        if under(m, "consumers")
    }
    offenders["tests.support.memory_source"] = sorted(
        imports_of_file(MEMORY_ADAPTER) - set(ADAPTER_MAY_IMPORT)
    )
    assert {m: ts for m, ts in offenders.items() if ts} == {}


def test_the_runtime_imports_no_operator_module() -> None:
    """The running bridge never reaches an operator verb or its faces."""
    faces = ("bridge.operator", "bridge.commands", "bridge.console")
    offenders = {
        m: sorted(t for t in imported(m) if any(under(t, f) for f in faces))
        for m in modules()
        if under(m, "bridge.runtime")
    }
    assert {m: ts for m, ts in offenders.items() if ts} == {}


def test_telemetry_imports_no_ingest_module() -> None:
    offenders = {
        m: sorted(t for t in imported(m) if under(t, "bridge.ingest"))
        for m in modules()
        if under(m, "bridge.telemetry")
    }
    assert {m: ts for m, ts in offenders.items() if ts} == {}


def test_only_the_store_and_the_pool_opener_import_psycopg_pool() -> None:
    """The pool is the store's: every other module reaches the database through a family of
    :mod:`bridge.store`, never through connections of its own taken from the pool."""
    offenders = {
        m: sorted(t for t in imported(m) if under(t, "psycopg_pool"))
        for m in modules()
        if not under(m, "bridge.store") and m != "bridge.database"
    }
    assert {m: ts for m, ts in offenders.items() if ts} == {}


def concrete_store_checks(path: Path) -> Iterator[int]:
    """The lines of ``isinstance(..., PostgresStore)`` (alone or in a tuple) in one file."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and len(node.args) == 2
        ):
            continue
        kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
        names = {k.id if isinstance(k, ast.Name) else getattr(k, "attr", None) for k in kinds}
        if "PostgresStore" in names:
            yield node.lineno


def test_no_code_outside_the_store_checks_for_the_concrete_store() -> None:
    """Code handed a store family uses it as given: a check for the concrete class is a
    reach past the family for the pool."""
    offenders = {
        m: list(concrete_store_checks(p))
        for m, p in modules().items()
        if not under(m, "bridge.store")
    }
    assert {m: lines for m, lines in offenders.items() if lines} == {}


def test_the_concrete_store_check_finds_a_check(tmp_path: Path) -> None:
    checked = tmp_path / "checked.py"
    checked.write_text(
        "if isinstance(store, PostgresStore): pass\n"
        "if isinstance(store, (int, bridge.store.PostgresStore)): pass\n"
        "if isinstance(store, int): pass\n"
    )
    assert list(concrete_store_checks(checked)) == [1, 2]


def sql_literals(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and SQL_STATEMENT.match(node.value)
        ):
            yield node.lineno, node.value.strip().splitlines()[0]


def test_the_sql_detector_finds_statements_and_passes_prose() -> None:
    statements = [
        "SELECT 1 FROM work_item",
        "  insert into work_item (a) values (1)",
        "UPDATE work_item SET state = 'queued' WHERE fence = %(fence)s",
        "DELETE FROM payload WHERE ref = %s",
        "WITH moved AS (DELETE FROM x RETURNING *) SELECT count(*) FROM moved",
        "select\n  tenant_id\nfrom work_item",
        "SELECT tenant_id, operation_id AS op, count(*) FROM work_item GROUP BY 1, 2",
    ]
    prose = [
        "Select the rows a redrive would move, from the parked ones.",
        "Update the lease while the handler reports progress.",
        "With ``exclusive``, the sweep runs only if no other process is sweeping.",
        "delete every row of one tenant",
    ]
    assert [bool(SQL_STATEMENT.match(s)) for s in statements] == [True] * len(statements)
    assert [bool(SQL_STATEMENT.match(s)) for s in prose] == [False] * len(prose)


def test_sql_lives_only_in_named_files_under_bridge_sql() -> None:
    found = {
        f"{path.relative_to(ROOT)}:{line}": text
        for path in modules().values()
        for line, text in sql_literals(path)
    }
    assert found == {}


def cycles(edges: dict[str, frozenset[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_cycle_finder_finds_a_cycle() -> None:
    edges = {
        "a": frozenset({"b"}),
        "b": frozenset({"c"}),
        "c": frozenset({"a"}),
        "d": frozenset({"a"}),
    }
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": frozenset({"b"}), "b": frozenset()}) == []


def test_no_import_cycles_among_the_core_modules() -> None:
    core = {m: frozenset(t for t in ts if under(t, "bridge")) for m, ts in graph().items()}
    assert cycles({m: ts for m, ts in core.items() if under(m, "bridge")}) == []
