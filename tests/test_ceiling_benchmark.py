"""benchmarks/ceiling.py cannot rot: one small round on each engine, with producer and
worker processes as the sweep runs them. Timing decides nothing: what is checked is that the
round's counts add up (every committed event reached a handler, runs were made and done)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dbs import TestDatabase

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def ceiling() -> ModuleType:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("ceiling")


def test_a_small_round_brings_every_event_to_a_handler(
    db: TestDatabase, ceiling: ModuleType
) -> None:
    ceiling.declare_consumers(db.engine)
    result = ceiling.one_round(
        db.engine,
        db.url.render_as_string(hide_password=False),
        db.engine_name,
        20.0,
        seconds=1.0,
        producers=2,
        workers=1,
        concurrency=2,
        poll_interval=0.2,
    )
    assert result.achieved > 0 and result.unconsumed == 0, result
    assert result.runs_made > 0 and result.runs_done > 0, result
    assert result.p50_ms <= result.p99_ms, result
