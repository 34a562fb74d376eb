"""MariaDB/MySQL facts that explain why sql/mysql looks the way it does. Each test fails if the
SQL is changed back to the obvious alternative (see the comments in sql/mysql/schema.sql)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
from assetq.dialects import MYSQL
from dbs import MYSQL_APP_DATABASE, TestDatabase

pytestmark = pytest.mark.engines("mysql")


@pytest.fixture
def my(db: TestDatabase) -> TestDatabase:
    return db


def _session(db: TestDatabase, *settings: str) -> sa.Engine:
    """An engine whose every connection runs ``settings`` first (SET statements)."""
    return db.new_engine(connect_args={"init_command": "; ".join(settings)})


def _setup(db: TestDatabase, events: int = 1) -> list[int]:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders")
        return [assetq.register_event(conn, "orders").id for _ in range(events)]


# -- isolation ---------------------------------------------------------------------------------


def test_at_repeatable_read_a_plain_read_after_the_lock_sees_rows_already_consumed(
    my: TestDatabase,
) -> None:
    """The engine fact: the snapshot is older than the lock, so a pass reading the queue that
    way would claim (and link again) events another pass consumed meanwhile."""
    (event,) = _setup(my)
    with my.engine.connect() as late:
        late = late.execution_options(isolation_level="REPEATABLE READ")
        late.begin()
        queue = my.sql("SELECT asset_event_id FROM {ns}.asset_dag_run_queue")
        assert late.execute(sa.text(queue)).scalars().all() == [event]  # snapshot taken
        (run,) = assetq.schedule(my.engine)  # another scheduler consumes and commits
        assert run.event_ids == (event,)
        lock = my.sql("SELECT dag_id FROM {ns}.dag_lock WHERE dag_id = 'consumer' FOR UPDATE")
        assert late.execute(sa.text(lock)).all()  # the lock is free again: we get it
        assert late.execute(sa.text(queue)).scalars().all() == [event]  # consumed, still seen
        late.rollback()


def test_a_pass_whose_snapshot_predates_its_lock_aborts_instead_of_claiming(
    my: TestDatabase,
) -> None:
    """schedule_pass checks that its snapshot is not older than the last run of the consumer
    it locked, and aborts with the claim guard's AQ900 (transient) otherwise."""
    (first,) = _setup(my)
    with my.engine.connect() as late:
        late = late.execution_options(isolation_level="REPEATABLE READ")
        late.begin()
        late.execute(sa.text(my.sql("SELECT count(*) FROM {ns}.dag_lock"))).all()  # snapshot
        assetq.schedule(my.engine)  # consumes `first`
        with my.engine.begin() as conn:
            second = assetq.register_event(conn, "orders").id
        with pytest.raises(sa.exc.DBAPIError) as info:
            late.execute(sa.text(my.sql("CALL {ns}.schedule_pass(10)"))).all()
        late.rollback()
    error = MYSQL.translate(info.value)
    assert isinstance(error, assetq.ClaimGuardAbort) and error.code == "AQ900"
    assert "READ COMMITTED" in str(error)
    (run,) = assetq.schedule(my.engine)
    assert run.event_ids == (second,)
    assert my.links() == [("consumer", first), ("consumer", second)]


def test_the_pass_runs_at_read_committed_whatever_the_engine_default(my: TestDatabase) -> None:
    """schedule() makes READ COMMITTED the level of the pass's own transaction, as its first
    statement. (MariaDB shows a one-transaction SET TRANSACTION in no variable, so the proof
    is the statement order; the stale-snapshot test above shows what RR would do.)"""
    engine = my.new_engine(isolation_level="REPEATABLE READ")
    statements: list[str] = []

    @sa.event.listens_for(engine, "begin")
    def began(conn: sa.Connection) -> None:
        statements.append("BEGIN")

    @sa.event.listens_for(engine, "before_cursor_execute")
    def record(conn: sa.Connection, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(" ".join(statement.split()))

    @sa.event.listens_for(engine, "commit")
    def committed(conn: sa.Connection) -> None:
        statements.append("COMMIT")

    _setup(my)
    assert len(assetq.schedule(engine)) == 1
    begin = statements.index("BEGIN")
    assert statements[begin + 1] == "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"
    assert statements[begin + 2].startswith("CALL ") and "schedule_pass" in statements[begin + 2]
    assert statements[begin + 3] == "COMMIT"


# -- the lock row -----------------------------------------------------------------------------


def test_a_producer_in_flight_would_make_a_pass_locking_the_dag_row_skip_the_consumer(
    my: TestDatabase,
) -> None:
    """A producer's foreign-key check holds a shared lock on the dag row until it commits, and
    MySQL has no NO KEY lock mode: FOR UPDATE SKIP LOCKED on the dag row skips the consumer.
    The unreferenced lock row is free, and the real pass consumes the committed event."""
    (committed,) = _setup(my)
    select = "SELECT dag_id FROM {ns}.%s WHERE dag_id = 'consumer' FOR UPDATE SKIP LOCKED"
    engine = _session(my, "SET SESSION innodb_lock_wait_timeout = 1")
    with my.engine.connect() as producer, engine.connect() as probe:
        assetq.register_event(producer, "orders")  # open: holds S on the dag row
        probe = probe.execution_options(isolation_level="READ COMMITTED")
        dag_row = probe.execute(sa.text(my.sql(select % "dag"))).all()
        probe.rollback()
        lock_row = probe.execute(sa.text(my.sql(select % "dag_lock"))).all()
        probe.rollback()
        assert (len(dag_row), len(lock_row)) == (0, 1)
        (run,) = assetq.schedule(engine, max_attempts=1)
        assert run.event_ids == (committed,)
        producer.commit()


# -- point-lookup deletes ---------------------------------------------------------------------


def test_a_pass_does_not_wait_for_an_uncommitted_producer_row_of_the_same_consumer(
    my: TestDatabase,
) -> None:
    """The pass deletes its claimed rows by primary key (STRAIGHT_JOIN from the claim); with
    a one-second lock wait timeout and no retry, any wait on the producer's uncommitted queue
    row of the same consumer would fail the pass."""
    (committed,) = _setup(my)
    engine = _session(my, "SET SESSION innodb_lock_wait_timeout = 1")
    with my.engine.connect() as producer, engine.connect() as probe:
        late = assetq.register_event(producer, "orders")  # uncommitted, same consumer
        # The engine fact: a delete that range-scans the consumer's rows reads the producer's
        # uncommitted row at the end of the range and waits for it, even at READ COMMITTED.
        probe = probe.execution_options(isolation_level="READ COMMITTED")
        with pytest.raises(sa.exc.OperationalError, match="1205"):
            probe.execute(
                sa.text(
                    my.sql(
                        "DELETE FROM {ns}.asset_dag_run_queue"
                        " WHERE target_dag_id = 'consumer' AND asset_event_id <= :e"
                    )
                ),
                {"e": committed},
            )
        probe.rollback()
        (run,) = assetq.schedule(engine, max_attempts=1)
        assert run.event_ids == (committed,)
        producer.commit()
    (run,) = assetq.schedule(my.engine)
    assert run.event_ids == (late.id,)


def test_the_claim_delete_is_a_primary_key_lookup_per_claimed_row(my: TestDatabase) -> None:
    """The plan of the pass's DELETE: the claim table first, then one eq_ref lookup of the
    queue's primary key per claimed id (no range scan over the consumer's rows)."""
    _setup(my, events=3)
    with my.engine.connect() as conn:
        conn.execute(
            sa.text(
                my.sql(
                    "CREATE TEMPORARY TABLE {ns}._assetq_claim"
                    " (asset_event_id BIGINT NOT NULL PRIMARY KEY, asset_id BIGINT NOT NULL,"
                    " created_at DATETIME(6) NOT NULL)"
                )
            )
        )
        conn.execute(
            sa.text(
                my.sql(
                    "INSERT INTO {ns}._assetq_claim SELECT asset_event_id, asset_id, created_at"
                    " FROM {ns}.asset_dag_run_queue"
                )
            )
        )
        plan = (
            conn.execute(
                sa.text(
                    my.sql(
                        "EXPLAIN DELETE q FROM {ns}._assetq_claim k"
                        " STRAIGHT_JOIN {ns}.asset_dag_run_queue q"
                        " ON q.target_dag_id = 'consumer' AND q.asset_event_id = k.asset_event_id"
                    )
                )
            )
            .mappings()
            .all()
        )
        conn.rollback()
    by_table = {row["table"]: row for row in plan}
    assert [row["table"] for row in plan] == ["k", "q"]
    assert (by_table["q"]["type"], by_table["q"]["key"]) == ("eq_ref", "PRIMARY")


# -- no truncation ----------------------------------------------------------------------------


def test_a_run_links_every_claimed_event_beyond_group_concat_max_len(my: TestDatabase) -> None:
    """500 ids do not fit in GROUP_CONCAT's 1024 bytes (MySQL's default): the claim is held in
    a temporary table and the result's id list is built with the limit raised, then restored."""
    _setup(my, events=0)
    asset_id = my.scalar("SELECT id FROM {ns}.asset WHERE name = 'orders'")
    my.execute(
        "INSERT INTO {ns}.asset_event (asset_id) VALUES " + ", ".join(["(:a)"] * 500), a=asset_id
    )
    engine = _session(my, "SET SESSION group_concat_max_len = 1024")
    with engine.connect() as conn:
        cut = conn.execute(
            sa.text(my.sql("SELECT GROUP_CONCAT(asset_event_id) FROM {ns}.asset_dag_run_queue"))
        ).scalar_one()
        assert len(cut) <= 1024 and len(cut.split(",")) < 500  # the engine fact
    (run,) = assetq.schedule(engine)
    assert len(run.event_ids) == 500
    assert len(my.links()) == 500
    assert my.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == 0
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="READ COMMITTED")
        conn.execute(sa.text(my.sql("CALL {ns}.schedule_pass(10)"))).all()
        assert conn.execute(sa.text("SELECT @@SESSION.group_concat_max_len")).scalar_one() == 1024
        conn.rollback()


# -- timestamps -------------------------------------------------------------------------------


def test_timestamps_are_utc_whatever_the_session_time_zone(my: TestDatabase) -> None:
    """DATETIME keeps no zone and NOW(6) follows the session's time_zone: assetq writes
    UTC_TIMESTAMP(6) only, so a session at +05:00 changes nothing it stores or returns."""
    engine = _session(my, "SET time_zone = '+05:00'")
    with engine.connect() as conn:
        local, utc = conn.execute(sa.text("SELECT NOW(6), UTC_TIMESTAMP(6)")).one()
        assert timedelta(hours=4, minutes=59) < local - utc < timedelta(hours=5, minutes=1)
    before = datetime.now(timezone.utc)
    with engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders")
        event = assetq.register_event(conn, "orders")
        asset_id = conn.execute(
            sa.text(my.sql("SELECT id FROM {ns}.asset WHERE name = 'orders'"))
        ).scalar_one()
        conn.execute(
            sa.text(my.sql("INSERT INTO {ns}.asset_event (asset_id) VALUES (:a)")), {"a": asset_id}
        )
    after = datetime.now(timezone.utc)
    assert before - timedelta(seconds=1) <= event.timestamp <= after + timedelta(seconds=1)
    stored = my.rows("SELECT `timestamp` FROM {ns}.asset_event ORDER BY id")
    for (value,) in stored:
        assert (
            before - timedelta(seconds=1)
            <= value.replace(tzinfo=timezone.utc)
            <= after + timedelta(seconds=1)
        )
    (run,) = assetq.schedule(engine)
    assert before - timedelta(seconds=1) <= run.created_at <= datetime.now(timezone.utc)
    assert run.run_id.startswith(f"asset_triggered__{run.run_after:%Y-%m-%dT%H:%M:%S.%f}+00:00__")


# -- CALL results -----------------------------------------------------------------------------


def test_every_call_result_is_read_so_the_connection_goes_on(my: TestDatabase) -> None:
    """A CALL that returns rows leaves its status result behind; the next statement on the
    same connection, in the same transaction, must work."""
    with my.engine.connect() as conn:
        assetq.declare_dag(conn, "consumer", "orders")  # a CALL without a result set
        first = assetq.register_event(conn, "orders")  # a CALL with one
        second = assetq.register_event(conn, "orders")
        asset_id = assetq.declare_asset(conn, "customers")
        assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
        conn.commit()
    assert second.id == first.id + 1 and asset_id
    assert my.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == 2


def test_an_error_raised_after_a_call_returned_rows_is_not_swallowed(my: TestDatabase) -> None:
    """SQLAlchemy only logs an error found while closing the cursor; assetq reads every result
    of a CALL itself, so a routine failing after its result set still raises."""
    _setup(my, events=0)
    my.execute("DROP PROCEDURE {ns}.declare_asset")
    my.execute(
        "CREATE PROCEDURE {ns}.declare_asset(IN p_name TEXT, IN p_uri TEXT, IN p_extra JSON)"
        " BEGIN SELECT 1 AS asset_id;"
        " SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '[AQ002] failed after its rows'; END"
    )
    with (
        pytest.raises(assetq.InvalidArgument, match="failed after its rows"),
        my.engine.begin() as conn,
    ):
        assetq.declare_asset(conn, "customers")


# -- one database ---------------------------------------------------------------------------


def test_a_user_with_one_database_installs_into_it_and_uninstall_keeps_it(
    empty_db: TestDatabase,
) -> None:
    namespace = MYSQL_APP_DATABASE  # the URL's own database
    assetq.install(empty_db.engine, namespace)
    with empty_db.engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders", namespace=namespace)
        assetq.register_event(conn, "orders", namespace=namespace)
    (run,) = assetq.schedule(empty_db.engine, namespace=namespace)
    assert len(run.event_ids) == 1
    assetq.uninstall(empty_db.engine, namespace)
    with empty_db.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT DATABASE()")).scalar_one() == namespace
        left = conn.execute(
            sa.text("SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = :ns"),
            {"ns": namespace},
        ).scalar_one()
        assert left == 0
        assert assetq.current_revision(conn, namespace) is None
