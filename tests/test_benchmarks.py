"""benchmarks/bench.py cannot rot: every figure runs, tiny, on each engine, and the report
(page, plots, raw figures) is written. Timing decides nothing here."""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dbs import TestDatabase

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("bench")


def test_every_figure_runs_and_the_report_is_written(
    db: TestDatabase, bench: ModuleType, tmp_path: Path
) -> None:
    cfg = dataclasses.replace(
        bench.QUICK,
        threads=(1, 2),
        seconds=0.1,
        batch_size=20,
        batch_seconds=0.1,
        consumers=6,
        assets=3,
        pending_events=2,
        history=(200, 400),
        run_sizes=(10, 100),
        burndown_runs=100,
        burndown_threads=2,
        burndown_history=200,
        burndown_probes=1,
        # The suite never installs anything: without procrastinate its side is skipped.
        burndown_peer="if-installed",
        peers_clients=(1, 2),
        peers_consumers=(4,),
        peers_seconds=0.05,
        peers_repetitions=1,
        peers_batch=20,
        peers_backlog=200,
        peers_whole_repetitions=1,
        peers_profile=1,  # the client-CTE variant: a copy namespace, altered and dropped
        # Nor here: a peer that is not installed (PgQ's Debian package, pgmq's or
        # procrastinate's wheel) is skipped, with one line saying so.
        peers_install="if-installed",
    )
    report = bench.new_report("pytest", cfg)
    results = bench.run_engine(bench.Target(db.engine), cfg, list(bench.FIGURES))
    bench.add_engine(report, db.engine_name, "test server", {}, results)
    bench.finish_report(report, 1.0)
    importlib.import_module("report").write(report, tmp_path)

    page = (tmp_path / "benchmarks.md").read_text()
    assert "## Targets" in page and "Scheduler pass against history" in page
    assert "## Worker burn-down" in page
    for plot in ("registration", "batch", "pass", "large_run"):
        assert (tmp_path / "benchmarks" / f"{plot}.png").stat().st_size > 0
        assert f"benchmarks/{plot}.png" in page
    figures = json.loads((tmp_path / "benchmarks.json").read_text())["engines"][db.engine_name]
    assert set(figures) >= set(bench.FIGURES)
    assert figures["pass"]["queued_rows"] == 4  # 2 pending events x 2 consumers per asset
    assert "## Against the peers" in page
    _check_peers(figures["peers"], db.engine_name)


def _every_rate(figure: dict[str, list[float]]) -> list[float]:
    return [rate for rates in figure.values() for rate in rates]


def _check_peers(figure: dict[str, Any], engine_name: str) -> None:
    """Every side of every work did work (events counted, not timed), and each peer is either
    measured or said to be skipped."""
    producer = figure["producer"]["4/1"]
    assert min(_every_rate(producer)) > 0
    if engine_name != "postgresql":
        assert set(producer) == {"assetq", "plain statements"}
        return
    peers = importlib.import_module("peers")
    for peer in (peers.PGQ, peers.PGMQ, peers.PROCRASTINATE):
        assert (peer in producer) != (peer in figure["notes"]), peer
    assert min(_every_rate(figure["batch"])) > 0
    for work in ("whole", "1000", "1"):
        assert "assetq" in figure["drain"][work]
        assert min(_every_rate(figure["drain"][work])) > 0
    rows = figure["profile"]["rates"]
    assert len(rows) == 2 + (peers.PGQ in producer) and min(_every_rate(rows)) > 0
    # The floors: assetq, its three plain sides (producer, batch) or the run's writes (whole
    # backlog), and PgQ where it is installed, each having done work.
    floors = figure["floors"]
    for work in ("producer/1", "producer/2", "batch", "whole"):
        sides = {peers.ASSETQ, peers.PGQ} & set(producer) | (
            {peers.FLOOR_RUN}
            if work == "whole"
            else {peers.FLOOR_ALL, peers.FLOOR_EVENT, peers.FLOOR_PK}
        )
        assert set(floors[work]) == sides, work
        assert min(_every_rate(floors[work])) > 0, work


def test_the_page_is_what_report_py_draws_from_the_raw_figures(tmp_path: Path) -> None:
    """docs/benchmarks.md is never edited by hand: report.py re-draws it, word for word, from
    docs/benchmarks.json, docs/benchmarks/latency.md, docs/benchmarks/wakeup_gap.md,
    docs/benchmarks/register.md and docs/benchmarks/burndown_cli.md."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    report = importlib.import_module("report")
    docs = BENCHMARKS.parent / "docs"
    raw = json.loads((docs / "benchmarks.json").read_text("utf-8"))
    (tmp_path / "benchmarks").mkdir()
    for included in ("latency.md", "wakeup_gap.md", "register.md", "burndown_cli.md"):
        text = (docs / "benchmarks" / included).read_text("utf-8")
        (tmp_path / "benchmarks" / included).write_text(text, "utf-8")
    report.write(raw, tmp_path)
    drawn = (tmp_path / "benchmarks.md").read_text("utf-8")
    assert drawn == (docs / "benchmarks.md").read_text("utf-8")


def test_a_figure_of_a_development_schema_says_what_0_1_0_installs_of_it() -> None:
    """The revisions before 0.1.0 are gone; a figure measured at one of them says so, and
    only the last one's tables and routines are the baseline's."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    report = importlib.import_module("report")
    assert report._assetq("0.1.0 (schema 0015_batch_lookups)") == (
        "0.1.0, measured at development schema 0015_batch_lookups, whose tables and routines"
        " the 0.1.0 baseline installs unchanged"
    )
    older = report._assetq("0.1.0 (schema 0007_capped_claim)")
    assert older.startswith("0.1.0, measured at development schema 0007_capped_claim (")
    assert "not measured again" in older
    # A run at a revision of the package is shown as bench.py wrote it.
    head = "0.1.0 (schema 0001_baseline)"
    assert report._assetq(head) == head
    # The page and the latency figures never name a development revision as a plain schema.
    docs = BENCHMARKS.parent / "docs"
    for page in (docs / "benchmarks.md", docs / "benchmarks" / "latency.md"):
        text = page.read_text("utf-8")
        for match in re.finditer(r"(\w+ )?schema (\d{4}_\w+)", text):
            if match[2] in report.migrate.DEVELOPMENT_REVISIONS:
                assert match[1] == "development ", (page.name, match[0])
