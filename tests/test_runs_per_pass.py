"""Runs per pass (issue 16, since development revision 0011_runs_per_pass): a capped consumer
gets as many runs in one scheduler pass as its backlog fills, up to its share of the pass.

The share is the pass's limit divided by the consumers it takes (at least 1); uncapped and
partitioned consumers are unchanged. Proven on both engines: the runs one pass makes are those
consecutive single passes made before (same claims, same order, consecutive seq); the share,
max_active_runs and the condition stop it; a second scheduler skips a consumer a pass holds
(several connections, the first pass's commit held back); and what a pass reads grows with the
runs it makes, never with the backlog behind them (counters, not timings).
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

import assetq
import pass_reads
import scenario
from assetq import api
from dbs import TestDatabase


def _batch(db: TestDatabase, *assets: str) -> list[assetq.Event]:
    """Events of ``assets`` in one transaction (one timestamp: queue order is id order)."""
    with db.engine.begin() as conn:
        return assetq.register_events(conn, [{"asset": a} for a in assets])


def _event_ids(row: Any) -> tuple[int, ...]:
    return api._event_ids(row.event_ids)  # as assetq.schedule reads them, on either engine


def test_one_pass_drains_a_capped_backlog_up_to_its_limit_in_queue_order(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "each", "orders", max_events_per_run=1)
    events = scenario.ids(_batch(db, *["orders"] * 250))
    first = assetq.schedule(db.engine, limit=100)
    assert [r.event_ids for r in first] == [(e,) for e in events[:100]]
    assert [r.seq for r in first] == list(range(1, 101))
    assert len({r.run_id for r in first}) == 100
    assert scenario.queued(db, "each") == list(events[100:])
    second = assetq.schedule(db.engine, limit=100)
    third = assetq.schedule(db.engine, limit=100)
    assert [r.event_ids for r in second + third] == [(e,) for e in events[100:]]
    assert [len(second), len(third)] == [100, 50]
    assert assetq.schedule(db.engine) == []
    assert scenario.queued(db, "each") == []
    with db.engine.connect() as conn:
        linked = conn.execute(
            sa.text(
                db.sql(
                    "SELECT count(*), count(DISTINCT asset_event_id) FROM {ns}.dagrun_asset_event"
                )
            )
        ).one()
    assert tuple(linked) == (250, 250)


def test_the_runs_of_one_pass_are_those_consecutive_passes_made(db: TestDatabase) -> None:
    """all_of(a, b) capped at 2, queued a1 a2 a3 b1 b2: one pass makes [a1, b1] then [a2, b2]
    (the witness search each time) and stops where the condition no longer holds; a3 stays."""
    scenario.declare(db, "pairs", assetq.all_of("a", "b"), max_events_per_run=2)
    a1, a2, a3, b1, b2 = scenario.ids(_batch(db, "a", "a", "a", "b", "b"))
    runs = assetq.schedule(db.engine)
    assert [r.event_ids for r in runs] == [(a1, b1), (a2, b2)]
    assert [r.triggering_event_id for r in runs] == [b1, b2]
    assert [r.seq for r in runs] == [1, 2]
    assert scenario.queued(db, "pairs") == [a3]
    assert assetq.schedule(db.engine) == []


def test_max_active_runs_bounds_the_runs_of_a_pass(db: TestDatabase) -> None:
    scenario.declare(db, "capped", "orders", max_events_per_run=1, max_active_runs=3)
    events = scenario.ids(_batch(db, *["orders"] * 10))
    runs = assetq.schedule(db.engine)
    assert [r.event_ids for r in runs] == [(e,) for e in events[:3]]
    assert assetq.schedule(db.engine) == []  # three active: at the cap
    with db.engine.begin() as conn:
        assetq.set_run_state(conn, "capped", runs[0].run_id, "success")
    (fourth,) = assetq.schedule(db.engine)
    assert fourth.event_ids == (events[3],)
    assert scenario.queued(db, "capped") == list(events[4:])


def test_each_consumer_gets_its_share_of_the_pass(db: TestDatabase) -> None:
    """Three capped consumers with 20 events each and an uncapped one, limit 12: four taken,
    a share of 3 runs each; the uncapped one gets its whole queue in one run."""
    for name in ("c1", "c2", "c3"):
        scenario.declare(db, name, "orders", max_events_per_run=1)
    scenario.declare(db, "whole", "orders")
    events = scenario.ids(_batch(db, *["orders"] * 20))
    runs = assetq.schedule(db.engine, limit=12)
    by_dag: dict[str, list[tuple[int, ...]]] = {}
    for run in runs:
        by_dag.setdefault(run.dag_id, []).append(run.event_ids)
    assert by_dag == {
        "c1": [(e,) for e in events[:3]],
        "c2": [(e,) for e in events[:3]],
        "c3": [(e,) for e in events[:3]],
        "whole": [events],
    }
    assert len(runs) <= 12
    # A pass of limit 1 takes one consumer, with a share of one run: the single claim of
    # before development revision 0011_runs_per_pass, the least recently examined consumer
    # first.
    (one,) = assetq.schedule(db.engine, limit=1)
    assert one.event_ids == (events[3],)


def test_a_second_scheduler_skips_the_consumer_a_pass_holds(db: TestDatabase) -> None:
    """Pass A makes its runs and does not commit; pass B, on another connection, skips the
    consumer (SKIP LOCKED) and claims nothing of it; once A commits, B's next pass continues
    after A's runs. Every event once."""
    scenario.declare(db, "each", "orders", max_events_per_run=1)
    events = scenario.ids(_batch(db, *["orders"] * 30))
    with db.engine.connect() as a, db.engine.connect() as b:
        a = a.execution_options(isolation_level="READ COMMITTED")
        b = b.execution_options(isolation_level="READ COMMITTED")
        a.begin()
        made_a = pass_reads.schedule_pass(db, a, 10)
        assert [_event_ids(r) for r in made_a] == [(e,) for e in events[:10]]
        with b.begin():
            assert pass_reads.schedule_pass(db, b, 10) == []  # held by A: skipped, not waited for
        a.commit()
        with b.begin():
            made_b = pass_reads.schedule_pass(db, b, 10)
    assert [_event_ids(r) for r in made_b] == [(e,) for e in events[10:20]]
    assert [int(r.seq) for r in made_a + made_b] == list(range(1, 21))
    assert scenario.queued(db, "each") == list(events[20:])


# -- cost: reads grow with the runs a pass makes, never with the backlog ----------------------


def test_a_pass_of_many_capped_runs_reads_per_run_whatever_the_backlog(
    db: TestDatabase, request: pytest.FixtureRequest
) -> None:
    pass_reads.expect_mysql97_plan_flip(db, request)
    scenario.declare(db, "each", "orders", max_events_per_run=2)
    pass_reads.backlog(db, 2_000)
    if db.dialect.name == "postgresql":
        small = pass_reads.pg_queue_reads(db, 100)
        pass_reads.backlog(db, 20_000)
        big = pass_reads.pg_queue_reads(db, 100)
        for runs, reads in (small, big):
            assert runs == 100, (small, big)
            # Per run: the N + 1 oldest by index and the deletion by key, a handful of
            # entries; the candidate probe may read the first queued row by a scan.
            assert reads["seq_tup_read"] <= 1, (small, big)
            assert reads["idx_tup_read"] <= 10 * runs, (small, big)
            assert reads["idx_tup_fetch"] <= 10 * runs, (small, big)
        return
    with db.engine.connect() as raw:
        conn = raw.execution_options(isolation_level="READ COMMITTED")
        # Warm-up: caches and statistics.
        assert pass_reads.mysql_pass_reads(db, conn, 100)[0] == 100
        small = pass_reads.mysql_pass_reads(db, conn, 100)
        pass_reads.backlog(db, 20_000)
        big = pass_reads.mysql_pass_reads(db, conn, 100)
    assert small[0] == big[0] == 100
    # The same rows with ten times the backlog behind them: per run the N + 1 oldest, the
    # deletion by key, the position the next run reads from and the temporary tables' own
    # rows, never the backlog. Measured: equal but for Handler_read_key, one lookup more of
    # 714 with the larger backlog (the same in three runs; not understood). A read that grew
    # with the backlog would differ by thousands.
    for key, value in small[1].items():
        assert abs(big[1][key] - value) <= 2, (key, small, big)
    assert sum(small[1].values()) <= 100 * 80, small


@pytest.mark.parametrize("limit", [1, 7])
def test_a_pass_never_makes_more_runs_than_its_limit(db: TestDatabase, limit: int) -> None:
    for name in ("c1", "c2"):
        scenario.declare(db, name, "orders", max_events_per_run=1)
    _batch(db, *["orders"] * 10)
    runs = assetq.schedule(db.engine, limit=limit)
    assert len(runs) == max(limit // 2, 1) * min(limit, 2)
    assert len(runs) <= limit
