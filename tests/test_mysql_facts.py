"""MariaDB/MySQL facts that explain why sql/mysql looks the way it does. Each test fails if the
SQL is changed back to the obvious alternative (see the comments in sql/mysql/tables.sql and in
the routine files, sql/mysql/routines/<name>.sql)."""

from __future__ import annotations

import json
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


def _mariadb(conn: sa.Connection) -> bool:
    """MariaDB rather than MySQL proper, where a fact below differs between them."""
    return bool(getattr(conn.dialect, "is_mariadb", False))


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
    assetq.schedule(engine)  # an engine's first call also checks the schema (one statement)
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

        mariadb = _mariadb(conn)
        if not mariadb:
            # MySQL 9 explains as a tree by default (explain_format = TREE); the table, as on
            # MariaDB and MySQL 8.
            conn.execute(sa.text("SET SESSION explain_format = TRADITIONAL"))

        def plan_of(hint: str) -> dict[str, Any]:
            rows = (
                conn.execute(
                    sa.text(
                        my.sql(
                            "EXPLAIN DELETE q FROM {ns}._assetq_claim k"
                            f" STRAIGHT_JOIN {{ns}}.asset_dag_run_queue q {hint}"
                            " ON q.target_dag_id = 'consumer'"
                            " AND q.asset_event_id = k.asset_event_id"
                        )
                    )
                )
                .mappings()
                .all()
            )
            assert [row["table"] for row in rows] == ["k", "q"]
            return {row["table"]: row for row in rows}

        # As the pass sends it (0007_capped_claim): one primary-key lookup per claimed id.
        hinted = plan_of("FORCE INDEX (PRIMARY)")
        # Why the hint: the queue's order index (0007) also starts with target_dag_id and
        # holds the primary key, and MariaDB prefers reading the consumer's rows through it.
        unhinted = plan_of("")
        conn.rollback()
    assert (hinted["q"]["type"], hinted["q"]["key"]) == ("eq_ref", "PRIMARY")
    # MySQL (9.7) takes the primary key unhinted too: the hint is MariaDB's need.
    assert (unhinted["q"]["key"] != "PRIMARY") == mariadb, unhinted["q"]


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
    assetq.install(empty_db.engine, namespace=namespace)
    with empty_db.engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders", namespace=namespace)
        assetq.register_event(conn, "orders", namespace=namespace)
    (run,) = assetq.schedule(empty_db.engine, namespace=namespace)
    assert len(run.event_ids) == 1
    assetq.uninstall(empty_db.engine, namespace=namespace)
    with empty_db.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT DATABASE()")).scalar_one() == namespace
        left = conn.execute(
            sa.text("SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = :ns"),
            {"ns": namespace},
        ).scalar_one()
        assert left == 0
        assert assetq.current_revision(conn, namespace=namespace) is None


# -- runs as work (since development revision 0006_work_queue) ----------------------------------


def _queued_run(db: TestDatabase, dag_id: str = "consumer", asset: str = "orders") -> assetq.Run:
    """Consumer ``dag_id`` on ``asset`` (declared if new) with one more queued run."""
    with db.engine.begin() as conn:
        if not conn.execute(
            sa.text(db.sql("SELECT count(*) FROM {ns}.dag WHERE dag_id = :d")), {"d": dag_id}
        ).scalar_one():
            assetq.declare_dag(conn, dag_id, asset, max_attempts=2)
        assetq.register_event(conn, asset)
    (run,) = assetq.schedule(db.engine)
    return run


def _claim_in(conn: sa.Connection, db: TestDatabase, dag_ids: str | None) -> list[Any]:
    """claim_runs called in ``conn``'s open transaction, at READ COMMITTED as assetq does."""
    MYSQL.execute(conn, "scheduler_transaction", db.namespace)
    params = {
        "worker": "held",
        "limit": 1,
        "lease_seconds": 60,
        "dag_ids": dag_ids,
        "timeout_seconds": None,
    }
    return list(MYSQL.execute(conn, "claim_runs", db.namespace, params))


def test_a_claim_that_locked_the_dag_row_too_would_skip_a_consumer_a_producer_registers_for(
    my: TestDatabase,
) -> None:
    """MariaDB has no FOR UPDATE OF: a locking join of dag_run with dag locks the dag row too,
    and every producer in flight holds a shared lock on it (the fan-out's read, the queue's
    foreign key). claim_runs locks dag_run rows alone and reads the consumer's options plainly."""
    run = _queued_run(my)
    engine = _session(my, "SET SESSION innodb_lock_wait_timeout = 1")
    with my.engine.connect() as producer, engine.connect() as probe:
        assetq.register_event(producer, "orders")  # open: holds S on the dag row
        probe = probe.execution_options(isolation_level="READ COMMITTED")
        joined = probe.execute(
            sa.text(
                my.sql(
                    "SELECT r.id, d.max_attempts FROM {ns}.dag_run r"
                    " JOIN {ns}.dag d ON d.dag_id = r.dag_id"
                    " WHERE r.not_before <= UTC_TIMESTAMP(6) FOR UPDATE SKIP LOCKED"
                )
            )
        ).all()
        probe.rollback()
        assert joined == []  # the engine fact: the run is skipped
        (claim,) = assetq.claim_runs(engine, "w1", max_attempts=1)
        assert claim.run_id == run.run_id
        producer.commit()


def test_a_locking_read_through_an_index_keeps_the_rows_it_refused_so_a_claim_locks_by_key(
    my: TestDatabase,
) -> None:
    """At READ COMMITTED a locking read through a secondary index keeps every row it read
    locked to the end, those its WHERE refused too: one locking statement over the claim index
    for consumer a would hold b's older run, and b's worker would skip it. claim_runs reads the
    candidates plainly and locks them by primary key, where a refused row is let go."""
    older = _queued_run(my, "b", "invoices")
    _queued_run(my, "a", "orders")
    with my.engine.connect() as holder:
        holder = holder.execution_options(isolation_level="READ COMMITTED")
        one_statement = (
            holder.execute(
                sa.text(
                    my.sql(
                        "SELECT r.dag_id FROM {ns}.dag_run r FORCE INDEX (dag_run_claim_idx)"
                        " WHERE r.not_before <= UTC_TIMESTAMP(6) AND r.dag_id = 'a'"
                        " ORDER BY r.not_before, r.id LIMIT 1 FOR UPDATE SKIP LOCKED"
                    )
                )
            )
            .scalars()
            .all()
        )
        assert one_statement == ["a"]
        if not _mariadb(holder):
            # MySQL (9.7) lets the refused row go even through a secondary index: b's run can
            # be claimed. claim_runs' way is MariaDB's need, and costs MySQL nothing.
            (claim,) = assetq.claim_runs(my.engine, "wb", dag_ids=["b"])
            assert claim.run_id == older.run_id
            holder.rollback()
            return
        assert assetq.claim_runs(my.engine, "wb", dag_ids=["b"]) == []  # the engine fact
        holder.rollback()
        (held,) = _claim_in(holder, my, '["a"]')  # claim_runs itself, transaction left open
        assert held.dag_id == "a"
        (claim,) = assetq.claim_runs(my.engine, "wb", dag_ids=["b"])
        assert claim.run_id == older.run_id
        holder.rollback()


def test_a_claim_in_index_order_locks_only_what_it_takes_a_sorting_plan_locks_every_candidate(
    my: TestDatabase,
) -> None:
    """Locking reads lock rows as they are read, before any sort: with ORDER BY ... LIMIT
    served by a sort, every candidate stays locked, and other claimers find nothing. claim_runs
    forces its plans in not_before order, so an open claim of one run leaves the others free."""
    for _ in range(3):
        _queued_run(my)
    with my.engine.connect() as holder:
        holder = holder.execution_options(isolation_level="READ COMMITTED")
        holder.execute(
            sa.text(
                my.sql(
                    "SELECT r.id FROM {ns}.dag_run r IGNORE INDEX (dag_run_claim_idx)"
                    " WHERE r.not_before <= UTC_TIMESTAMP(6)"
                    " ORDER BY r.not_before, r.id LIMIT 1 FOR UPDATE SKIP LOCKED"
                )
            )
        ).all()
        assert assetq.claim_runs(my.engine, "w2", limit=3) == []  # the engine fact
        holder.rollback()
        (held,) = _claim_in(holder, my, None)
        others = assetq.claim_runs(my.engine, "w2", limit=3)
        assert len(others) == 2 and held.dag_run_id not in {c.id for c in others}
        holder.rollback()


def test_complete_run_registers_its_events_without_calling_register_events(
    my: TestDatabase,
) -> None:
    """A SELECT in a procedure another procedure calls still sends its rows to the client: a
    complete_run that CALLed register_events would return two result sets. Both call
    insert_event_batch, which leaves its rows in a temporary table."""
    run = _queued_run(my)
    with my.engine.begin() as conn:
        assetq.declare_asset(conn, "report_out")
    my.execute(
        "CREATE PROCEDURE {ns}.nested_probe(IN p_events JSON)"
        " BEGIN CALL {ns}.register_events(p_events); SELECT 'after' AS step; END"
    )
    (claim,) = assetq.claim_runs(my.engine, "w1")
    events = '[{"asset": "report_out"}, {"asset": "report_out"}]'

    def result_sets(statement: str, *args: Any) -> list[list[tuple[Any, ...]]]:
        with my.engine.connect() as conn:
            cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                cursor.execute(my.sql(statement), args)
                sets = []
                while True:
                    if cursor.description is not None:
                        sets.append(list(cursor.fetchall()))
                    if not cursor.nextset():
                        break
            finally:
                cursor.close()
            conn.rollback()
        return sets

    nested = result_sets("CALL {ns}.nested_probe(%s)", events)
    assert [len(s) for s in nested] == [2, 1]  # the engine fact: register_events' rows, then ours
    (completed,) = result_sets(
        "CALL {ns}.complete_run(%s, %s, %s, 'success', NULL, %s)",
        claim.dag_id,
        claim.run_id,
        claim.attempt,
        events,
    )
    ((*_, output, partition_key),) = completed  # the columns of complete_run's result
    assert len(json.loads(output)) == 2 and partition_key is None
    with my.engine.begin() as conn:  # and committed, the same once more through the API
        info = assetq.complete_run(conn, claim, "success", events=[{"asset": "report_out"}])
    assert info.run_id == run.run_id and len(info.output_event_ids) == 1
    assert my.scalar("SELECT count(*) FROM {ns}.asset_event") == 2  # orders and report_out


def test_complete_run_reads_the_consumer_plainly_and_never_waits_for_a_producer(
    my: TestDatabase,
) -> None:
    """PostgreSQL's complete_run locks the run FOR NO KEY UPDATE OF r in a join with dag; on
    MySQL the same join FOR UPDATE waits for every producer in flight (their shared lock on
    the dag row). complete_run locks the run row alone and reads the retry options plainly."""
    _queued_run(my)
    (claim,) = assetq.claim_runs(my.engine, "w1")
    engine = _session(my, "SET SESSION innodb_lock_wait_timeout = 1")
    with my.engine.connect() as producer, engine.connect() as probe:
        assetq.register_event(producer, "orders")  # open: holds S on the dag row
        with pytest.raises(sa.exc.OperationalError, match="1205"):
            probe.execute(
                sa.text(
                    my.sql(
                        "SELECT r.id, d.max_attempts FROM {ns}.dag_run r"
                        " JOIN {ns}.dag d ON d.dag_id = r.dag_id"
                        " WHERE r.dag_id = :d AND r.run_id = :r FOR UPDATE"
                    )
                ),
                {"d": claim.dag_id, "r": claim.run_id},
            )
        probe.rollback()
        with engine.begin() as conn:
            info = assetq.complete_run(conn, claim, "failed", error="boom")
        assert (info.state, info.error) == ("queued", "boom")  # max_attempts 2: a retry
        producer.commit()


def test_a_claim_reads_the_consumers_options_without_waiting_for_a_declaration(
    my: TestDatabase,
) -> None:
    """A claim that meets an expired lease needs the consumer's max_attempts. An UPDATE
    joined with dag waits for a declare_dag in flight (its lock on the dag row) even at READ
    COMMITTED; the INSERT ... SELECT claim_runs reads it with does not."""
    run = _queued_run(my)
    (claim,) = assetq.claim_runs(my.engine, "w1")
    my.execute(  # the lease has expired (on the database's clock)
        "UPDATE {ns}.dag_run SET lease_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND,"
        " not_before = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE id = :id",
        id=claim.id,
    )
    engine = _session(my, "SET SESSION innodb_lock_wait_timeout = 1")
    with my.engine.connect() as declaring, engine.connect() as probe:
        assetq.declare_dag(declaring, "consumer", "orders", max_attempts=2)  # open: X on dag
        probe = probe.execution_options(isolation_level="READ COMMITTED")
        probe.execute(
            sa.text(
                my.sql(
                    "CREATE TEMPORARY TABLE {ns}.probe_cap"
                    " (dag_id VARCHAR(250) PRIMARY KEY, max_attempts INT)"
                )
            )
        )
        probe.execute(sa.text(my.sql("INSERT INTO {ns}.probe_cap VALUES ('consumer', NULL)")))
        with pytest.raises(sa.exc.OperationalError, match="1205"):
            probe.execute(
                sa.text(
                    my.sql(
                        "UPDATE {ns}.probe_cap k JOIN {ns}.dag d ON d.dag_id = k.dag_id"
                        " SET k.max_attempts = d.max_attempts"
                    )
                )
            )
        probe.rollback()
        (again,) = assetq.claim_runs(engine, "w2", max_attempts=1)
        assert (again.run_id, again.attempt) == (run.run_id, 2)
        declaring.commit()


def test_a_claim_never_reads_the_finished_history(my: TestDatabase) -> None:
    """MySQL has no partial index: finished runs stay in dag_run_claim_idx with not_before
    NULL, where a range "not_before <= now" never goes. The rows a claim reads (handler
    counters) are the same with 10 finished runs and with 2,000."""
    _queued_run(my)

    def add_history(count: int) -> None:
        start = int(my.scalar("SELECT COALESCE(MAX(seq), 0) FROM {ns}.dag_run")) + 100
        rows = ", ".join(
            f"('consumer', 'history_{n}', {n}, UTC_TIMESTAMP(6), 'success')"
            for n in range(start, start + count)
        )
        my.execute(
            "INSERT INTO {ns}.dag_run (dag_id, run_id, seq, run_after, state) VALUES " + rows
        )

    def rows_read() -> int:
        with my.engine.connect() as conn:
            status = "SHOW SESSION STATUS LIKE 'Handler_read%'"
            before = {k: int(v) for k, v in conn.execute(sa.text(status)).all()}
            (claim,) = _claim_in(conn, my, None)
            after = {k: int(v) for k, v in conn.execute(sa.text(status)).all()}
            conn.rollback()
        assert claim.dag_id == "consumer"
        return sum(after[k] - before[k] for k in after)

    add_history(10)
    # Warm: a connection's first call of a routine also reads its definition, which MySQL 8+
    # keeps in InnoDB tables (its data dictionary) and counts in the same counters; and the
    # first claims a server runs open what dag_run's trigger writes (dag_run_attempt).
    rows_read()
    small = rows_read()
    add_history(1990)
    assert my.scalar("SELECT count(*) FROM {ns}.dag_run WHERE not_before IS NULL") == 2000
    assert rows_read() == small


def test_dag_run_gets_no_attempt_check_because_adding_one_copies_the_table(
    my: TestDatabase,
) -> None:
    """0006 adds its dag_run columns in place (ALGORITHM=INSTANT); a CHECK constraint cannot
    be added in place on either engine, and dag_run holds the history, so none is added (the
    routines are the only writers of attempt)."""
    with pytest.raises(sa.exc.DBAPIError, match="1845"):
        my.execute(
            "ALTER TABLE {ns}.dag_run ADD CONSTRAINT dag_run_attempt_check"
            " CHECK (attempt >= 0), ALGORITHM=INPLACE"
        )
    my.execute(
        "ALTER TABLE {ns}.dag_run ADD COLUMN probe INT NOT NULL DEFAULT 0, ALGORITHM=INSTANT"
    )
    checks = my.rows(
        "SELECT constraint_name FROM information_schema.check_constraints"
        " WHERE constraint_schema = :ns AND constraint_name LIKE 'dag_run%'",
        ns=my.namespace,
    )
    assert [c for (c,) in checks if "attempt" in c] == []


def test_an_update_joined_from_a_small_claim_table_scans_dag_run_without_its_key_hint(
    my: TestDatabase,
) -> None:
    """On a small dag_run the optimizer runs a multi-table UPDATE from a temporary table of
    ids as a scan of dag_run (a join buffer), STRAIGHT_JOIN or not, and an UPDATE locks every
    row it scans: it waits for a run another worker holds. claim_runs (and the pass's reaper)
    force dag_run's primary key on every such join."""
    for _ in range(3):
        _queued_run(my)
    engine = _session(my, "SET SESSION innodb_lock_wait_timeout = 1")
    with my.engine.connect() as holder, engine.connect() as probe:
        (held,) = _claim_in(holder, my, None)  # open: one run locked
        probe = probe.execution_options(isolation_level="READ COMMITTED")
        probe.execute(
            sa.text(my.sql("CREATE TEMPORARY TABLE {ns}.probe_ids (id BIGINT PRIMARY KEY)"))
        )
        fill = "INSERT INTO {ns}.probe_ids SELECT id FROM {ns}.dag_run WHERE id <> :h"
        update = (
            "UPDATE {ns}.probe_ids k STRAIGHT_JOIN {ns}.dag_run r%s ON r.id = k.id"
            " SET r.updated_at = UTC_TIMESTAMP(6)"
        )
        changed = []
        for hint in ("", " FORCE INDEX (PRIMARY)"):
            probe.execute(sa.text(my.sql(fill)), {"h": held.dag_run_id})
            try:
                changed.append(probe.execute(sa.text(my.sql(update % hint))).rowcount)
            except sa.exc.OperationalError as exc:
                assert exc.orig is not None
                changed.append(str(exc.orig.args[0]))
            probe.rollback()
        # The engine fact, and the hinted plan. MySQL (9.7) reaches dag_run by its key
        # unhinted too: the hint is MariaDB's need, and costs MySQL nothing.
        assert changed == (["1205", 2] if _mariadb(probe) else [2, 2])
        holder.rollback()


def test_at_repeatable_read_mysql_reads_information_schema_from_the_transactions_snapshot(
    my: TestDatabase,
) -> None:
    """MySQL 8+ keeps its catalog in InnoDB tables (the data dictionary) and reads
    information_schema from them in the transaction's snapshot: at REPEATABLE READ a table
    another session created after the first read stays unseen until the transaction ends.
    MariaDB's information_schema is not transactional. Why an installer commits before it
    waits for the namespace lock (lifecycle.sql, end_snapshot): it would otherwise take a
    namespace another installer filled meanwhile for an empty one (AQ122, seen on MySQL 9.7
    in test_concurrent_installs_both_succeed_with_one_schema)."""
    count = (
        "SELECT COUNT(*) FROM information_schema.TABLES"
        " WHERE TABLE_SCHEMA = :ns AND TABLE_NAME = 'probe_created'"
    )
    with my.engine.connect() as reader:
        reader = reader.execution_options(isolation_level="REPEATABLE READ")
        with reader.begin():
            assert reader.execute(sa.text(count), {"ns": my.namespace}).scalar_one() == 0
            my.execute("CREATE TABLE {ns}.probe_created (id INT PRIMARY KEY)")
            seen = reader.execute(sa.text(count), {"ns": my.namespace}).scalar_one()
            assert seen == (1 if _mariadb(reader) else 0)  # the engine fact
        assert reader.execute(sa.text(count), {"ns": my.namespace}).scalar_one() == 1
        reader.rollback()
    my.execute("DROP TABLE {ns}.probe_created")
