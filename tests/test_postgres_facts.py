"""PostgreSQL facts that explain why the SQL looks the way it does. Each test fails if the SQL
is changed back to the obvious alternative."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

import assetq
from dbs import TestDatabase

pytestmark = pytest.mark.engines("postgresql")


@pytest.fixture
def pg(db: TestDatabase) -> TestDatabase:
    return db


def test_for_update_would_skip_a_consumer_whose_producer_is_in_flight(pg: TestDatabase) -> None:
    """A producer's queue insert holds KEY SHARE on the consumer row (foreign key check).
    FOR UPDATE conflicts with it, so a pass using it would skip every busy consumer;
    FOR NO KEY UPDATE does not."""
    with pg.engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders")
        assetq.register_event(conn, "orders")
    select = "SELECT dag_id FROM {ns}.dag WHERE dag_id = 'consumer' %s SKIP LOCKED"
    with pg.engine.connect() as producer, pg.engine.connect() as probe:
        assetq.register_event(producer, "orders")  # open transaction: holds KEY SHARE
        for_update = probe.execute(sa.text(pg.sql(select % "FOR UPDATE"))).all()
        probe.rollback()
        no_key = probe.execute(sa.text(pg.sql(select % "FOR NO KEY UPDATE"))).all()
        probe.rollback()
        assert (len(for_update), len(no_key)) == (0, 1)
        # and the real pass consumes the committed event while the producer is in flight
        (run,) = assetq.schedule(pg.engine)
        assert len(run.event_ids) == 1
        producer.commit()


def test_the_pass_runs_at_read_committed_whatever_the_engine_default(pg: TestDatabase) -> None:
    """At REPEATABLE READ the pass would fail with 40001 on rows consumed after its snapshot;
    schedule() sets READ COMMITTED on its own connection."""
    engine = pg.new_engine(isolation_level="REPEATABLE READ")
    seen: list[Any] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def record(conn: sa.Connection, cursor: Any, statement: str, *args: Any) -> None:
        if "schedule_pass" in statement:
            seen.append(conn.get_isolation_level())

    with engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders")
        assetq.register_event(conn, "orders")
    assert len(assetq.schedule(engine)) == 1
    assert seen == ["READ COMMITTED"]


def test_scheduler_statements_never_scan_event_or_run_history(pg: TestDatabase) -> None:
    """The pass touches history tables only by key: no sequential scan of asset_event,
    dag_run or dagrun_asset_event with 20,000 consumed events and 5,000 runs of history."""
    history = [
        "INSERT INTO {ns}.asset_event (id, asset_id)"
        " SELECT g, a.id FROM {ns}.asset a, generate_series(1, 20000) g",
        "INSERT INTO {ns}.dag_run (id, dag_id, run_id, seq, run_after)"
        " SELECT g, 'consumer', 'old__' || g, g, now() FROM generate_series(1, 5000) g",
        "INSERT INTO {ns}.dagrun_asset_event (dag_run_id, asset_event_id, dag_id)"
        " SELECT (g + 3) / 4, g, 'consumer' FROM generate_series(1, 20000) g",
        "UPDATE {ns}.dag SET last_run_seq = 5000",
        "DELETE FROM {ns}.asset_dag_run_queue",
        "SELECT setval(pg_get_serial_sequence('{ns}.asset_event', 'id'), 20000)",
        "SELECT setval(pg_get_serial_sequence('{ns}.dag_run', 'id'), 5000)",
    ]
    with pg.engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders")
        for statement in history:
            conn.execute(sa.text(pg.sql(statement)))
    pg.execute("ANALYZE")
    with pg.engine.begin() as conn:
        assetq.register_event(conn, "orders")

    stats = (
        "SELECT relname, seq_scan FROM pg_stat_user_tables WHERE schemaname = 'assetq'"
        " AND relname IN ('asset_event', 'dag_run', 'dagrun_asset_event')"
    )
    with pg.engine.connect() as conn:
        # One connection for the pass and the readings: statistics are per backend until
        # flushed, and pg_stat_force_next_flush() flushes only its own backend's.
        def seq_scans() -> dict[str, int]:
            if _has_force_flush(pg):  # flushes at the end of this transaction
                conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
                conn.commit()
            conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
            rows = conn.execute(sa.text(stats)).all()
            conn.commit()
            return {r[0]: int(r[1]) for r in rows}

        before = seq_scans()
        runs = conn.execute(sa.text(pg.sql("SELECT * FROM {ns}.schedule_pass(100)"))).all()
        conn.commit()
        after = seq_scans()
    assert len(runs) == 1
    assert after == before


def _has_force_flush(db: TestDatabase) -> bool:
    return bool(
        db.scalar("SELECT count(*) FROM pg_proc WHERE proname = 'pg_stat_force_next_flush'")
    )
