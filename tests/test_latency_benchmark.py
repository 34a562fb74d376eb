"""benchmarks/latency.py cannot rot: a short latency round on each engine and every producer
cost row on PostgreSQL run here, tiny. Timing decides nothing: what is checked is that every
event committed was consumed and that every row of the report is there."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dbs import TestDatabase

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def latency() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("latency")


@pytest.mark.parametrize("scenario", ["idle", "load"])
def test_a_latency_round_measures_every_event_it_committed(
    db: TestDatabase, latency: ModuleType, scenario: str
) -> None:
    latency._setup(db.engine)
    result = latency.measure(
        db.engine,
        engine_name=db.engine_name,
        listen=db.dialect.supports_notify,
        scenario=scenario,
        seconds=0.5,
        producers=2,
        poll_interval=0.2,
    )
    # measure() raises when a committed event was never consumed.
    assert result.events > 0
    assert len(result.latencies_ms) == result.events
    # (A latency may be a little below zero: the scheduler's thread can see the run before
    # the producer's thread reads the clock after its COMMIT returned.)
    with db.engine.connect() as conn:
        assert not conn.exec_driver_sql(db.sql("SELECT 1 FROM {ns}.asset_dag_run_queue")).first()


@pytest.mark.engines("postgresql")
def test_the_producer_cost_has_every_row_and_leaves_the_trigger_on(
    db: TestDatabase, latency: ModuleType
) -> None:
    latency._setup(db.engine)
    rows = latency.producer_cost(db.engine, 0.2, 2, 1)
    assert [row[:3] for row in rows] == [
        (state, mode, threads)
        for state in ("none", "running", "2 running", "waiting")
        for mode in ("durable", "async")
        for threads in (1, 2)
    ]
    assert all(on[0] > 0 and off[0] > 0 for *_, on, off in rows)
    enabled = db.scalar(
        "SELECT tgenabled FROM pg_trigger WHERE tgname = 'asset_dag_run_queue_notify'"
        " AND tgrelid = CAST('{ns}.asset_dag_run_queue' AS regclass)"
    )
    assert enabled == "O"


@pytest.mark.engines("postgresql")
def test_the_command_writes_the_page_that_docs_benchmarks_md_includes(
    db: TestDatabase, latency: ModuleType, tmp_path: Path
) -> None:
    """`python benchmarks/latency.py --output F`, tiny, against the test server: F holds the
    command, both tables, and goes into the page report.py writes."""
    url = db.url.set(drivername="postgresql", database="postgres")
    page = tmp_path / "benchmarks" / "latency.md"
    argv = ["--engines", "postgresql", "--seconds", "0.3", "--repetitions", "1"]
    argv += ["--producers", "2", "--poll-interval", "0.2", "--output", str(page)]
    argv += ["--postgres", url.render_as_string(hide_password=False)]
    assert latency.main(argv) == 0
    text = page.read_text("utf-8")
    assert text.startswith("Measured with `python benchmarks/latency.py --engines postgresql")
    assert "schema " + latency.assetq.head_revision() in text
    for row in ("| notify  | idle  |", "| poll    | load  |", "2 running  | durable |"):
        assert row in text
    sys.path.insert(0, str(BENCHMARKS))
    report = importlib.import_module("report")
    assert text.rstrip("\n") in "\n".join(report.latency_section(text))
