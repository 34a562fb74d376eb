"""benchmarks/wakeup_gap.py cannot rot: its --quick mode runs on each engine, with `assetq
scheduler`, `assetq worker` (and, where it is installed, procrastinate's worker) started from
the command line, and writes the page docs/benchmarks.md includes. Timing decides nothing:
what is checked is that every row is there with the counts it says, and that the run leaves
no database behind."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import sqlalchemy as sa

from dbs import TestDatabase

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def wakeup_gap() -> ModuleType:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("wakeup_gap")


def _databases(db: TestDatabase) -> set[str]:
    query = (
        "SELECT datname FROM pg_database"
        if db.engine_name == "postgresql"
        else "SELECT schema_name FROM information_schema.schemata"
    )
    with db.engine.connect() as conn:
        names = conn.execute(sa.text(query)).scalars().all()
    return {name for name in names if name.startswith("aqbench_wakeup_")}


def test_the_quick_mode_writes_every_row(
    db: TestDatabase, wakeup_gap: ModuleType, tmp_path: Path
) -> None:
    server = db.url.set(database="postgres" if db.engine_name == "postgresql" else None)
    page = tmp_path / "benchmarks" / "wakeup_gap.md"
    argv = ["--quick", "--engines", db.engine_name, "--output", str(page)]
    argv += [f"--{'postgres' if db.engine_name == 'postgresql' else 'mysql'}"]
    argv += [server.render_as_string(hide_password=False)]
    # MySQL's scheduler polls (5 s by default): a short poll keeps the smoke run short.
    argv += ["--scheduler-poll", "0.2"]
    before = _databases(db)
    assert wakeup_gap.main(argv) == 0
    assert _databases(db) == before  # the run's database is dropped

    text = page.read_text("utf-8")
    assert text.startswith("Measured with `python benchmarks/wakeup_gap.py --quick")
    assert "load average (1 min)" in text
    # The gap: both loads, both handlers, 3 runs x 1 round each (2 gaps apiece).
    for load in ("idle", "flood"):
        for handler in ("0.1 s", "0 s"):
            assert re.search(rf"\| {load} \| {handler} \| 3 x 1 \| [\d.,]+ / [\d.,]+ \|", text), (
                load,
                handler,
            )
    # The first hop: 3 probes of assetq per block (1 on MySQL, whose scheduler polls);
    # procrastinate's beside them where it runs.
    peer = db.engine_name == "postgresql" and wakeup_gap.peer_installed()
    probes = 3 if db.engine_name == "postgresql" else 1
    for load in ("idle", "flood"):
        assert re.search(rf"\| {load} \| assetq \| {probes} \| ", text), load
        assert bool(re.search(rf"\| {load} \| procrastinate \| 3 \| ", text)) == peer, load
        if db.engine_name == "postgresql":
            # The pass can end before the producer's COMMIT returns to it: a negative stretch.
            assert re.search(rf"\| {load} \| assetq \| 3 \| .*\| pass -?[\d.]+ / claim", text), load
    # Every flood block was measured and what it left undone counted.
    assert "left undone at the end of a flood block: assetq queued runs" in text
    report = importlib.import_module("report")
    assert text.rstrip("\n") in "\n".join(report.wakeup_gap_section(text))
