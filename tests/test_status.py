"""assetq.status and `assetq status`: the dag_queue_status view, one row per consumer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
import sqlalchemy as sa

import assetq
from dbs import TestDatabase


def _assetq(db: TestDatabase, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASSETQ_")}
    env["ASSETQ_DATABASE_URL"] = db.url.render_as_string(hide_password=False)
    return subprocess.run(
        [sys.executable, "-m", "assetq", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def _status(db: TestDatabase) -> dict[str, assetq.DagStatus]:
    with db.engine.connect() as conn:
        return {s.dag_id: s for s in assetq.status(conn)}


def test_status_shows_queue_depth_and_the_oldest_queued_event_per_consumer(
    db: TestDatabase,
) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
        assetq.declare_dag(conn, "sales", assetq.all_of("orders", "payments"))
        assetq.declare_dag(conn, "idle", "refunds", paused=True)
        first = assetq.register_event(conn, "orders")
        assetq.register_event(conn, "orders")
    shown = _status(db)
    assert list(shown) == ["idle", "report", "sales"]
    report = shown["report"]
    assert (report.is_paused, report.queued_events, report.oldest_queued_at) == (
        False,
        2,
        first.timestamp,
    )
    assert report.oldest_queued_age_seconds is not None and report.oldest_queued_age_seconds >= 0
    assert (report.runs_last_hour, report.runs_total, report.last_run_at) == (0, 0, None)
    assert shown["sales"].queued_events == 2
    idle = shown["idle"]
    assert (
        idle.is_paused,
        idle.queued_events,
        idle.oldest_queued_at,
        idle.oldest_queued_age_seconds,
    ) == (
        True,
        0,
        None,
        None,
    )


def test_status_counts_runs_and_what_stays_queued_after_a_pass(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
        assetq.declare_dag(conn, "sales", assetq.all_of("orders", "payments"))
        assetq.register_event(conn, "orders")
    (run,) = assetq.schedule(db.engine)  # sales waits for payments
    shown = _status(db)
    report, sales = shown["report"], shown["sales"]
    assert (report.queued_events, report.runs_last_hour, report.runs_total) == (0, 1, 1)
    assert report.last_run_at == run.created_at
    assert report.last_scheduled_at == run.created_at
    assert (sales.queued_events, sales.runs_total, sales.last_run_at) == (1, 0, None)
    assert sales.last_scheduled_at is not None


def test_runs_older_than_an_hour_leave_the_hourly_count_but_not_the_total(
    db: TestDatabase,
) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
        assetq.register_event(conn, "orders")
    (run,) = assetq.schedule(db.engine)
    # The same text on both engines: PostgreSQL reads INTERVAL '2' HOUR as MySQL does.
    db.execute(
        "UPDATE {ns}.dag_run SET created_at = created_at - INTERVAL '2' HOUR WHERE id = :id",
        id=run.id,
    )
    report = _status(db)["report"]
    assert (report.runs_last_hour, report.runs_total) == (0, 1)
    assert report.last_run_at == run.created_at - timedelta(hours=2)


def test_the_status_view_cannot_be_written_through(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
    for statement in (
        "UPDATE {ns}.dag_queue_status SET queued_events = 5",
        "DELETE FROM {ns}.dag_queue_status",
    ):
        with pytest.raises(sa.exc.DBAPIError):
            db.execute(statement)
    assert _status(db)["report"].queued_events == 0


def test_status_command_prints_the_revision_and_one_line_per_consumer(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
        assetq.register_event(conn, "orders")
    done = _assetq(db, "status")
    assert done.returncode == 0, done.stderr
    assert f"schema {assetq.head_revision()}" in done.stdout
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("report")]
    assert line.split()[:3] == ["report", "active", "1"]


def test_status_shows_active_runs_against_the_cap(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "capped", "orders", max_active_runs=1)
        assetq.declare_dag(conn, "free", "orders")
        assetq.register_event(conn, "orders")
    assert len(assetq.schedule(db.engine)) == 2
    with db.engine.begin() as conn:
        assetq.register_event(conn, "orders")
    assert [r.dag_id for r in assetq.schedule(db.engine)] == ["free"]
    shown = _status(db)
    assert (shown["capped"].active_runs, shown["capped"].max_active_runs) == (1, 1)
    assert shown["capped"].queued_events == 1  # held back whole while at the cap
    assert (shown["free"].active_runs, shown["free"].max_active_runs) == (2, None)
    done = _assetq(db, "status")
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("capped")]
    assert line.split()[:5] == ["capped", "active", "1", line.split()[3], "1/1"]
    (free,) = [x for x in done.stdout.splitlines() if x.startswith("free")]
    assert free.split()[2:5] == ["0", "-", "2/-"]  # nothing queued, no age, no cap
    data = json.loads(_assetq(db, "status", "--json").stdout)
    capped = next(c for c in data["consumers"] if c["dag_id"] == "capped")
    assert (capped["active_runs"], capped["max_active_runs"]) == (1, 1)


def test_status_command_json(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
        event = assetq.register_event(conn, "orders")
    done = _assetq(db, "status", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["revision"] == data["head"] == assetq.head_revision()
    (consumer,) = data["consumers"]
    assert consumer["dag_id"] == "report" and consumer["queued_events"] == 1
    assert consumer["oldest_queued_at"] == event.timestamp.isoformat()


def test_status_command_on_a_namespace_without_assetq_exits_1(db: TestDatabase) -> None:
    done = _assetq(db, "status", "--namespace", "aq_missing")
    assert done.returncode == 1
    assert "does not exist (or holds no assetq schema)" in done.stderr
