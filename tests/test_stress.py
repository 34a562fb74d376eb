"""The short version of the stress run (tests/stress.py), on every engine: seconds long.

The same load drives assetq and the timestamp-window baseline. assetq must lose, duplicate
and invent nothing; the baseline must lose events, which proves the harness can see the bug
it guards against. The long version: see the docstring of tests/stress.py.
"""

from __future__ import annotations

import pytest
from stress import AssetqAlgorithm, Report, WindowAlgorithm, format_table, run_load

from dbs import TestDatabase

LOAD = {"events": 800, "producers": 6, "schedulers": 2, "max_hold_ms": 20.0, "seed": 7}


def _run(db: TestDatabase, name: str) -> Report:
    engine = db.new_engine(pool_size=LOAD["producers"] + LOAD["schedulers"] + 2)
    algorithm = (
        AssetqAlgorithm(engine, db.namespace) if name == "assetq" else WindowAlgorithm(engine)
    )
    report = run_load(algorithm, engine_name=db.engine_name, deadline_s=120, **LOAD)  # type: ignore[arg-type]
    print(format_table([report]))
    return report


def test_assetq_delivers_every_committed_event_exactly_once_under_late_commits(
    db: TestDatabase,
) -> None:
    report = _run(db, "assetq")
    assert report.events > 600 and report.rolled_back > 0
    assert (report.lost, report.duplicated, report.empty_runs) == (0, 0, 0)
    assert (report.conditions_violated, report.rolled_back_linked) == (0, 0)
    assert report.runs > 0


def test_timestamp_window_baseline_loses_events_under_the_same_load(db: TestDatabase) -> None:
    report = _run(db, "window")
    assert report.events > 600
    if report.lost == 0:
        pytest.fail(
            f"the baseline lost nothing: the harness cannot see the bug\n{format_table([report])}"
        )
