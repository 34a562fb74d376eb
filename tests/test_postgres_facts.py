"""PostgreSQL facts that explain why the SQL looks the way it does. Each test fails if the SQL
is changed back to the obvious alternative."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

import assetq
import history
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


HISTORY_TABLES = ("asset_event", "dag_run", "dagrun_asset_event")


@pytest.mark.parametrize(
    "large", [200_000, pytest.param(1_000_000, marks=pytest.mark.slow, id="1M")]
)
def test_scheduler_statements_never_scan_event_or_run_history(pg: TestDatabase, large: int) -> None:
    """The pass touches history tables only by key: no sequential scan of asset_event,
    dag_run or dagrun_asset_event, and the same index reads of them with 10,000 and with
    ``large`` consumed events of history (tests/history.py), for the same 50 pending rows."""
    with pg.engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders")
        assetq.declare_dag(conn, "other", "orders")
    history.add_history(pg.engine, 10_000)
    small = _history_reads_of_a_pass(pg)
    history.add_history(pg.engine, large - 10_000)
    assert pg.scalar("SELECT count(*) FROM {ns}.dagrun_asset_event") == large + 100
    big = _history_reads_of_a_pass(pg)
    assert all(small[t]["seq_scan"] == 0 for t in HISTORY_TABLES), small
    # Nothing of the history is fetched, whatever its size. Until 0012_link_checks each link
    # made fetched its event and its run (100 each here: 50 events, two consumers: the links'
    # foreign-key checks); the link table has no foreign keys since. Until 0008_claim_plans
    # the planning of the pass's lease reaper probed the ends of dag_run's id index too, and
    # what those probes fetched varied with the visibility map: small and big differed by
    # one in a CI run.
    fetched = {t: small[t]["idx_tup_fetch"] for t in HISTORY_TABLES}
    assert fetched == {"asset_event": 0, "dag_run": 0, "dagrun_asset_event": 0}, small
    assert big == small


def _history_reads_of_a_pass(pg: TestDatabase) -> dict[str, dict[str, int]]:
    """Reads of the history tables by one pass over 50 events queued for two consumers."""
    with pg.engine.begin() as conn:
        assetq.register_events(conn, [{"asset": "orders"}] * 50)
    stats = (
        "SELECT relname, seq_scan, idx_scan, idx_tup_fetch FROM pg_stat_user_tables"
        " WHERE schemaname = 'assetq' AND relname IN :tables"
    )
    with pg.engine.connect() as conn:
        # One connection for the pass and the readings: statistics are per backend until
        # flushed, and pg_stat_force_next_flush() flushes only its own backend's.
        def reads() -> dict[str, dict[str, int]]:
            if _has_force_flush(pg):  # flushes at the end of this transaction
                conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
                conn.commit()
            conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
            query = sa.text(stats).bindparams(sa.bindparam("tables", expanding=True))
            rows = conn.execute(query, {"tables": list(HISTORY_TABLES)}).all()
            conn.commit()
            return {
                r[0]: {
                    "seq_scan": int(r[1]),
                    "idx_scan": int(r[2] or 0),
                    "idx_tup_fetch": int(r[3] or 0),
                }
                for r in rows
            }

        before = reads()
        runs = conn.execute(sa.text(pg.sql("SELECT * FROM {ns}.schedule_pass(100)"))).all()
        conn.commit()
        after = reads()
    assert len(runs) == 2 and all(len(r.event_ids) == 50 for r in runs)
    return {
        table: {key: after[table][key] - before[table][key] for key in after[table]}
        for table in HISTORY_TABLES
    }


def _has_force_flush(db: TestDatabase) -> bool:
    return bool(
        db.scalar("SELECT count(*) FROM pg_proc WHERE proname = 'pg_stat_force_next_flush'")
    )
