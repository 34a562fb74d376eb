"""benchmarks/register.py cannot rot: a tiny run on each engine measures the four variants
(the default path, savepoint=False, the client's savepoint, the plain INSERTs), checks that
they wrote the same rows, writes its markdown table, and leaves none of its namespaces
behind. Timing decides nothing."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest
import sqlalchemy as sa

from dbs import TestDatabase

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def register() -> ModuleType:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("register")


def _namespaces(db: TestDatabase) -> set[str]:
    query = "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'aqbench%'"
    with db.engine.connect() as conn:
        return {str(r[0]) for r in conn.execute(sa.text(query))}


def test_a_tiny_run_writes_the_table_of_the_four_variants(
    db: TestDatabase, register: ModuleType, tmp_path: Path
) -> None:
    before = _namespaces(db)
    out = tmp_path / "register.md"
    url = db.url.render_as_string(hide_password=False)
    args = ["--url", url, "--seconds", "0.1", "--repetitions", "1", "--threads", "1,2"]
    assert register.main([*args, "--consumers", "2", "--output", str(out)]) == 0
    page = out.read_text("utf-8")
    assert "python benchmarks/register.py --url URL --seconds 0.1" in page  # no URL shown
    header = (
        "| threads | assetq.register_event, events/s | savepoint=False, events/s"
        " | SAVEPOINT, call, RELEASE, events/s | plain INSERTs, events/s"
        " | assetq.register_event / plain INSERTs | savepoint=False / plain INSERTs"
        " | SAVEPOINT, call, RELEASE / plain INSERTs |"
    )
    assert header in page
    rows = [line for line in page.splitlines() if line.startswith(("| 1 |", "| 2 |"))]
    assert len(rows) == 2 and all(row.count("x |") == 3 for row in rows), rows
    # Every event of both namespaces has its two queue rows: the variants wrote alike.
    assert "Rows written, the same shape in both namespaces:" in page
    assert _namespaces(db) == before


@pytest.mark.engines("postgresql")
def test_the_sessions_commit_without_waiting_for_the_disk_unless_durable(
    db: TestDatabase, register: ModuleType, tmp_path: Path
) -> None:
    out = tmp_path / "register.md"
    url = db.url.render_as_string(hide_password=False)
    args = ["--url", url, "--seconds", "0.05", "--repetitions", "1", "--threads", "1"]
    register.main([*args, "--output", str(out)])
    register.main([*args, "--durable", "--output", str(out), "--append"])
    page = out.read_text("utf-8")
    with db.engine.connect() as conn:
        server = conn.execute(sa.text("SHOW synchronous_commit")).scalar_one()
    assert "synchronous_commit = off;" in page
    assert f"synchronous_commit = {server};" in page
    assert page.count("Measured with") == 2
