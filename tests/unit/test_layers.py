"""The import graph of outboxer has no cycle (import-linter checks the layers themselves)."""

from __future__ import annotations

import graphlib

import grimp


def test_outboxer_modules_import_each_other_without_a_cycle() -> None:
    # Every import counts, including those inside functions and under TYPE_CHECKING: a cycle
    # there still ties two modules together for a reader and for the next refactoring.
    graph = grimp.build_graph("outboxer", cache_dir=None)
    imports = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    try:
        graphlib.TopologicalSorter(imports).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None


def test_the_write_core_imports_no_writer_and_no_driver() -> None:
    # The writers are found at run time by outboxer.writers, by name: outboxer.outbox must not
    # reach a writer module (which imports its driver) through any chain of imports. The SQL
    # of the one-statement write (writers.cte) is driver-free text, built for the caller.
    graph = grimp.build_graph("outboxer", include_external_packages=True, cache_dir=None)
    reached = graph.find_upstream_modules("outboxer.outbox", as_package=False)
    assert {m for m in reached if m.startswith("outboxer.writers.")} == {"outboxer.writers.cte"}
    assert not reached & {"asyncpg", "psycopg", "aiosqlite", "sqlalchemy"}
