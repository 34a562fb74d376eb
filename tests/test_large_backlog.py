"""A large backlog is consumed set-based in the database: one run links every queued event and
clears the queue in one pass, and the Python side holds nothing per event but the run's ids.
(Airflow 3, apache/airflow#69848: one run of 50,000 events took 10 s and 290 MB of scheduler
memory on PostgreSQL.)"""

from __future__ import annotations

import tracemalloc

import assetq
import pass_reads
from dbs import TestDatabase

#: Generous ceiling for the Python memory one more event may cost during a pass: its id (an int
#: in a list and in the run's tuple, and its digits in MySQL's JSON text) is about 100 bytes.
BYTES_PER_EVENT = 200


def _peak_of_a_pass(db: TestDatabase, events: int) -> int:
    """Peak Python memory allocated during one pass that consumes ``events`` events."""
    pass_reads.backlog(db, events)  # set-based
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        (run,) = assetq.schedule(db.engine)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert len(run.event_ids) == events
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == 0
    assert (
        db.scalar("SELECT count(*) FROM {ns}.dagrun_asset_event WHERE dag_run_id = :r", r=run.id)
        == events
    )
    return peak


def test_one_run_consumes_50000_events_with_flat_python_memory(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders")
    _peak_of_a_pass(db, 10)  # warm up: pool, statement caches, first-call imports
    small_peak = _peak_of_a_pass(db, 5_000)
    large_peak = _peak_of_a_pass(db, 50_000)
    growth = (large_peak - small_peak) / 45_000
    assert growth < BYTES_PER_EVENT, (small_peak, large_peak)
