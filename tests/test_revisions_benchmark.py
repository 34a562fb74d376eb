"""benchmarks/revisions.py cannot rot: its two sides really are at the base revision and at
head, with the same consumers, and a tiny run (one round of one slice) writes through both
and leaves nothing behind (on MySQL each side is a database of the server: named after the
test's own). Timing decides nothing here."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest
import sqlalchemy as sa

import assetq
from assetq import migrate
from dbs import TestDatabase

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def revisions() -> ModuleType:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("revisions")


def test_the_sides_are_at_the_base_and_at_head_with_the_same_consumers(
    empty_db: TestDatabase, revisions: ModuleType
) -> None:
    head = assetq.head_revision()
    base = revisions._previous(head)
    assert base == list(migrate.revisions())[-2]
    names = revisions.prepare(empty_db.engine, base, 2, prefix=empty_db.name)
    try:
        with empty_db.engine.connect() as conn:
            assert {
                revision: assetq.current_revision(conn, namespace=ns)
                for revision, ns in names.items()
            } == {base: base, head: head}
        for ns in names.values():
            with empty_db.engine.connect() as conn:
                dags = conn.execute(
                    sa.text(f"SELECT dag_id FROM {empty_db.dialect.quote_ns(ns)}.dag")
                ).scalars()
                assert sorted(dags) == ["consumer_0", "consumer_1"]
    finally:
        for ns in names.values():
            assetq.uninstall(empty_db.engine, namespace=ns)


def test_a_tiny_run_writes_through_both_sides_and_cleans_up(
    empty_db: TestDatabase, revisions: ModuleType
) -> None:
    head = assetq.head_revision()
    base = revisions._previous(head)
    lines = revisions.measure(
        empty_db.engine,
        base,
        2,
        repetitions=1,
        seconds=0.25,
        prefix=empty_db.name,
        backlog=30,
        backlog_repetitions=2,
    )
    assert len(lines) == 4
    assert all(line.startswith(empty_db.engine_name) and line.endswith(")") for line in lines)
    assert "whole backlog, 30" in lines[3]
    with empty_db.engine.connect() as conn:
        for ns in (f"{empty_db.name}{side}" for side in ("_base", "_head", "_bl_base", "_bl_head")):
            assert assetq.current_revision(conn, namespace=ns) is None
