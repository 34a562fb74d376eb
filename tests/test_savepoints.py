"""Errors that leave the caller's transaction usable (issue 15, item 3).

assetq's writing functions run each routine call under a savepoint of its own (the default,
``savepoint=True``): a database-side error (unknown asset, idempotency conflict, unknown
consumer, ...) leaves the caller's transaction exactly as it was before the call, on both
engines. Each test writes a row of the caller's own first, catches the error, writes another
row, commits, and finds both rows and nothing of the failed call, through a Connection and
through an ORM Session.

The producer's calls pay no round trip for it (issue 29, item 5): register_event_v2 and
register_events_v2 take the savepoint inside the routine, and on PostgreSQL report the
error instead of raising it; the tests at the end count the round trips on the wire.

Without the savepoint the engines differ, which is why it is the default: PostgreSQL aborts
the caller's whole transaction (its commit becomes a rollback), MariaDB keeps a procedure's
statements that ran before the error (a batch whose second item reuses an idempotency key
keeps the first item).
"""

from __future__ import annotations

import logging
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from psycopg import pq
from sqlalchemy import Connection
from sqlalchemy.orm import Session

import assetq
from dbs import TestDatabase


@pytest.fixture
def app(db: TestDatabase) -> Iterator[TestDatabase]:
    """A database with an application table of the caller's, and a consumer of orders."""
    db.execute("CREATE TABLE {ns}.app_orders (id INTEGER PRIMARY KEY)")
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
        assetq.register_event(conn, "orders", idempotency_key="k1", extra={"n": 1})
        # A partitioned consumer: an event of regions needs a key it can map.
        assetq.declare_dag(
            conn,
            "by_region",
            "regions",
            partitioned={"regions": assetq.StaticPartitions({"eu-west-1": "eu"})},
        )
    yield db


def _insert_order(db: TestDatabase, handle: Connection | Session, order_id: int) -> None:
    handle.execute(
        sa.text(db.sql("INSERT INTO {ns}.app_orders (id) VALUES (:id)")), {"id": order_id}
    )


def _orders(db: TestDatabase) -> list[int]:
    return [int(r[0]) for r in db.rows("SELECT id FROM {ns}.app_orders ORDER BY id")]


@contextmanager
def _caller_transaction(db: TestDatabase, kind: str) -> Iterator[Connection | Session]:
    """The caller's transaction, through a Connection or an ORM Session, committed at the end."""
    if kind == "connection":
        with db.engine.connect() as conn:
            conn.begin()
            yield conn
            conn.commit()
    else:
        with Session(db.engine) as session:
            yield session
            session.commit()


#: (name, the failing call, the error it raises)
FAILING_CALLS: list[tuple[str, Callable[[Any], object], type[assetq.AssetqError], str]] = [
    (
        "unknown-asset",
        lambda h: assetq.register_event(h, "no_such_asset"),
        assetq.UnknownAsset,
        "AQ001",
    ),
    (
        "idempotency-conflict",
        lambda h: assetq.register_event(h, "orders", idempotency_key="k1", extra={"n": 2}),
        assetq.IdempotencyConflict,
        "AQ005",
    ),
    (
        # The first item is written before the second fails: MariaDB would keep it.
        "batch-second-item-unknown",
        lambda h: assetq.register_events(
            h, [assetq.NewEvent("orders"), assetq.NewEvent("no_such_asset")]
        ),
        assetq.UnknownAsset,
        "AQ001",
    ),
    (
        "batch-idempotency-conflict",
        lambda h: assetq.register_events(
            h,
            [
                assetq.NewEvent("orders", idempotency_key="fresh"),
                assetq.NewEvent("orders", idempotency_key="k1", extra={"n": 3}),
            ],
        ),
        assetq.IdempotencyConflict,
        "AQ005",
    ),
    (
        # Refused by the fan-out trigger, after the event's INSERT: the routine undoes it.
        "missing-partition-key",
        lambda h: assetq.register_event(h, "regions"),
        assetq.UnmappablePartition,
        "AQ011",
    ),
    (
        "unmappable-partition-key",
        lambda h: assetq.register_event(h, "regions", partition_key="ap-south-1"),
        assetq.UnmappablePartition,
        "AQ011",
    ),
    (
        "pause-unknown-dag",
        lambda h: assetq.pause_dag(h, "nobody"),
        assetq.UnknownDag,
        "AQ003",
    ),
    (
        "delete-asset-in-use",
        lambda h: assetq.delete_asset(h, "orders"),
        assetq.AssetInUse,
        "AQ007",
    ),
    (
        "set-state-unknown-run",
        lambda h: assetq.set_run_state(h, "report", "nope", "success"),
        assetq.UnknownRun,
        "AQ006",
    ),
]


@pytest.mark.parametrize("kind", ["connection", "session"])
def test_a_database_side_error_leaves_the_callers_transaction_as_it_was(
    app: TestDatabase, kind: str
) -> None:
    """Every failing call of FAILING_CALLS, one after the other in one caller transaction:
    after each error the caller writes a row of its own (it would fail on an aborted
    transaction), and at the end commits and finds every row, and nothing of the failed
    calls."""
    before = app.counts()
    with _caller_transaction(app, kind) as handle:
        _insert_order(app, handle, 0)
        assetq.register_event(handle, "orders")  # an assetq write of the caller's, kept too
        for number, (name, call, expected, code) in enumerate(FAILING_CALLS, start=1):
            with pytest.raises(expected) as raised:
                call(handle)
            assert raised.value.code == code, name
            try:
                _insert_order(app, handle, number)  # the transaction is usable
            except sa.exc.DBAPIError as exc:
                pytest.fail(f"after {name} the caller's transaction is unusable: {exc}")
    assert _orders(app) == list(range(len(FAILING_CALLS) + 1))
    after = app.counts()
    # Exactly the one event (and its queue row) registered before the errors was kept.
    assert after["asset_event"] == before["asset_event"] + 1
    assert after["asset_dag_run_queue"] == before["asset_dag_run_queue"] + 1
    assert {t: n for t, n in after.items() if t not in ("asset_event", "asset_dag_run_queue")} == {
        t: n for t, n in before.items() if t not in ("asset_event", "asset_dag_run_queue")
    }


def test_a_declaration_error_leaves_the_callers_transaction_as_it_was(app: TestDatabase) -> None:
    """declare_asset's savepoint too: a uri that belongs to another asset is refused by the
    database (AQ002)."""
    with app.engine.begin() as conn:
        assetq.declare_asset(conn, "orders", uri="s3://bucket/orders")
    before = app.counts()
    for kind in ("connection", "session"):
        with _caller_transaction(app, kind) as handle:
            _insert_order(app, handle, 1 if kind == "connection" else 3)
            with pytest.raises(assetq.InvalidArgument) as raised:
                assetq.declare_asset(handle, "other", uri="s3://bucket/orders")
            assert raised.value.code == "AQ002"
            _insert_order(app, handle, 2 if kind == "connection" else 4)
    assert _orders(app) == [1, 2, 3, 4]
    assert app.counts() == before


def test_a_registration_nests_inside_the_callers_own_savepoint(app: TestDatabase) -> None:
    """The routine's savepoint is its own and released by the call: the caller's savepoint
    around several calls still rolls back exactly those calls, and the transaction goes on
    (what a subtransaction left open, or released twice, would break)."""
    before = app.counts()["asset_event"]
    with app.engine.connect() as conn:
        conn.begin()
        kept = assetq.register_event(conn, "orders")
        nested = conn.begin_nested()
        for _ in range(3):
            assetq.register_event(conn, "orders")
            assetq.register_events(conn, [assetq.NewEvent("orders")])
        with pytest.raises(assetq.UnknownAsset):
            assetq.register_event(conn, "no_such_asset")
        nested.rollback()
        after = assetq.register_event(conn, "orders")
        conn.commit()
    ids = {int(r[0]) for r in app.rows("SELECT id FROM {ns}.asset_event")}
    assert app.counts()["asset_event"] == before + 2
    assert {kept.id, after.id} <= ids


def test_a_registration_sends_no_savepoint_statement(app: TestDatabase) -> None:
    """Neither register_event nor register_events sends SAVEPOINT or RELEASE, on either
    engine, not even when the call fails: the routine takes its savepoint itself. (A
    statement listener sends the calls through SQLAlchemy; the round-trip tests below count
    the lean path, which nothing listens to.)"""
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement.split()[0].upper())

    with app.engine.connect() as conn:
        sa.event.listen(conn, "before_cursor_execute", seen)
        with conn.begin():
            assetq.register_event(conn, "orders")
            assetq.register_events(conn, [assetq.NewEvent("orders")])
            with pytest.raises(assetq.UnknownAsset):
                assetq.register_event(conn, "no_such_asset")
            with pytest.raises(assetq.UnknownAsset):
                assetq.register_events(conn, [assetq.NewEvent("no_such_asset")])
    assert len(statements) == 4
    assert not {"SAVEPOINT", "RELEASE", "ROLLBACK"} & set(statements)


def test_no_savepoint_on_an_autocommit_connection(app: TestDatabase) -> None:
    """Autocommit: the call is its own transaction (one round trip); there is nothing of the
    caller's to keep, and SAVEPOINT outside a transaction would fail."""
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement.split()[0].upper())

    with app.engine.connect() as plain:
        conn = plain.execution_options(isolation_level="AUTOCOMMIT")
        sa.event.listen(conn, "before_cursor_execute", seen)
        event = assetq.register_event(conn, "orders")
        with pytest.raises(assetq.UnknownAsset):
            assetq.register_event(conn, "no_such_asset")
        assetq.register_events(conn, [assetq.NewEvent("orders")])
    assert "SAVEPOINT" not in statements
    assert app.scalar("SELECT count(*) FROM {ns}.asset_event WHERE id = :id", id=event.id) == 1


def test_a_connection_with_no_transaction_yet_gets_one_begun(app: TestDatabase) -> None:
    with app.engine.connect() as conn:
        assert not conn.in_transaction()
        assetq.register_event(conn, "orders")
        assert conn.in_transaction()
        conn.rollback()
    assert app.counts()["asset_event"] == 1  # the fixture's only


def test_a_lost_connection_during_the_call_raises_connection_lost_not_a_savepoint_error(
    app: TestDatabase,
) -> None:
    """Forced: the server session is killed right before the routine call is sent. The
    routine's savepoint went with the session; the caller gets the error that says what
    happened (ConnectionLost, transient: retry the whole transaction)."""
    with app.engine.connect() as conn:
        conn.begin()

        def kill_before_the_call(c: Any, cursor: Any, statement: str, *args: Any) -> None:
            if "register_event" in statement:
                app.kill(conn)

        sa.event.listen(conn, "before_cursor_execute", kill_before_the_call)
        with pytest.raises(assetq.ConnectionLost):
            assetq.register_event(conn, "orders")


def test_a_lost_connection_on_the_lean_path_raises_connection_lost(app: TestDatabase) -> None:
    """The same with nothing listening, so the call goes straight through the driver's cursor
    (both engines): the caller gets ConnectionLost and the pool never hands the dead
    connection out again."""
    with app.engine.connect() as conn:
        conn.begin()
        assetq.register_event(conn, "orders")
        app.kill(conn)
        with pytest.raises(assetq.ConnectionLost):
            assetq.register_event(conn, "orders")
        assert conn.invalidated
    with app.engine.begin() as conn:  # a fresh connection from the pool works
        assetq.register_event(conn, "orders")


@pytest.mark.engines("mysql")
def test_a_connection_lost_after_the_calls_rows_is_invalidated_not_rolled_back_by_the_pool(
    app: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """Forced: the session is killed after the CALL's rows were read and before its status
    (the interleaving an outage hit in CI, seen as the pool's ERROR "Exception during reset
    or similar"). Something listens to the connection's statements, so the call goes
    through SQLAlchemy's cursor and assetq reads the trailing results itself: the error is
    ConnectionLost, and the Connection is invalidated as SQLAlchemy does for its own
    statements, so the pool never rolls the dead session back (an ERROR with a traceback)
    nor hands it out again. The kill is real; the read of the status raises what the
    driver raises when the socket is gone (the status the server sent before the kill is
    still in the socket's buffer, so a real read would not fail here)."""
    dbapi = app.engine.dialect.loaded_dbapi
    with app.engine.connect() as conn:
        conn.begin()

        def killed_before_the_status(c: Any, cursor: Any, statement: str, *args: Any) -> None:
            if "register_event" not in statement:
                return
            app.kill(conn)

            read: list[bool] = []

            def lost() -> bool:
                # As PyMySQL's cursor after a failed read: the error once, then no more sets.
                if read:
                    return False
                read.append(True)
                raise dbapi.OperationalError(2013, "Lost connection to MySQL server during query")

            cursor.nextset = lost

        sa.event.listen(conn, "after_cursor_execute", killed_before_the_status)
        with caplog.at_level(logging.WARNING):
            with pytest.raises(assetq.ConnectionLost):
                assetq.register_event(conn, "orders", savepoint=False)
            assert conn.invalidated
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.engines("mysql")
def test_a_connection_lost_before_the_commit_of_an_autocommit_call_is_invalidated(
    app: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """Forced: on an autocommit connection (a worker's kept connection) a MySQL call gets a
    transaction of its own, committed through the driver; the session is killed after the
    call and before that COMMIT. The caller gets ConnectionLost (nothing was committed), and
    the Connection is invalidated: the pool neither resets the dead session (an ERROR with a
    traceback) nor hands it out again."""
    with app.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        session = conn.execute(app.engine_sql("backend_id")).scalar_one()

        def killed_after_the_call(c: Any, cursor: Any, statement: str, *args: Any) -> None:
            if "register_events" in statement:
                with app.engine.begin() as killer:
                    killer.execute(app.engine_sql("kill"), {"pid": session})

        sa.event.listen(conn, "after_cursor_execute", killed_after_the_call)
        with caplog.at_level(logging.WARNING):
            with pytest.raises(assetq.ConnectionLost):
                assetq.register_events(
                    conn, [{"asset": "orders", "idempotency_key": f"k-lost-{i}"} for i in (1, 2)]
                )
            assert conn.invalidated
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    stored = "SELECT COUNT(*) FROM {ns}.asset_event WHERE idempotency_key LIKE 'k-lost-%'"
    assert app.scalar(stored) == 0
    with app.engine.begin() as conn:  # a fresh connection from the pool works
        assetq.register_event(conn, "orders")


# -- why it is the default: the engines differ without it -----------------------------------


@pytest.mark.engines("postgresql")
def test_without_a_savepoint_postgresql_aborts_the_callers_transaction(app: TestDatabase) -> None:
    with app.engine.connect() as conn:
        conn.begin()
        _insert_order(app, conn, 1)
        with pytest.raises(assetq.UnknownAsset):
            assetq.register_event(conn, "no_such_asset", savepoint=False)
        with pytest.raises(sa.exc.InternalError, match="current transaction is aborted"):
            _insert_order(app, conn, 2)
        conn.rollback()
    assert _orders(app) == []


@pytest.mark.engines("mysql")
def test_mariadb_keeps_nothing_of_a_failed_batch_even_without_the_savepoint_argument(
    app: TestDatabase,
) -> None:
    """MariaDB undoes only the failed statement, and a batch writes with several: its first
    item stayed in the caller's transaction when the client sent no SAVEPOINT. The savepoint
    is now the routine's own (register_events_v2, which 0.1.0's register_events calls too),
    so the first item goes with the failed call whatever the caller passed."""
    before = app.counts()["asset_event"]
    with app.engine.connect() as conn:
        conn.begin()
        with pytest.raises(assetq.IdempotencyConflict):
            assetq.register_events(
                conn,
                [
                    assetq.NewEvent("orders", idempotency_key="fresh"),
                    assetq.NewEvent("orders", idempotency_key="k1", extra={"n": 3}),
                ],
                savepoint=False,
            )
        conn.commit()
    assert app.counts()["asset_event"] == before


# -- errors the routine cannot foresee ---------------------------------------------------------


def test_a_lock_timeout_in_the_call_leaves_the_callers_transaction_as_it_was(
    app: TestDatabase,
) -> None:
    """Forced: another transaction holds the asset's row as delete_asset does, so the event's
    foreign-key check waits, and the caller's lock timeout ends the wait (PostgreSQL 55P03,
    MySQL 1205): TransientError, the caller's own row and earlier event kept, its
    transaction usable and committed."""
    before = app.counts()
    holder_locked = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with app.engine.begin() as holder:
            holder.execute(app.engine_sql("lock_asset"), {"name": "orders"})
            holder_locked.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holder_locked.wait(30)
        with app.engine.connect() as conn:
            conn.execute(app.engine_sql("lock_timeout_1s"))  # begins the transaction
            _insert_order(app, conn, 1)
            kept = assetq.register_event(conn, "regions", partition_key="eu-west-1")
            with pytest.raises(assetq.TransientError) as raised:
                assetq.register_event(conn, "orders")
            assert raised.value.code in ("55P03", "1205")
            _insert_order(app, conn, 2)
            conn.commit()
    finally:
        release.set()
        thread.join()
    assert _orders(app) == [1, 2]
    assert app.counts()["asset_event"] == before["asset_event"] + 1
    assert app.scalar("SELECT count(*) FROM {ns}.asset_event WHERE id = :id", id=kept.id) == 1


# -- round trips ---------------------------------------------------------------------------------


class RoundTrips:
    """Counts the round trips a connection makes, on the wire: PostgreSQL, libpq's protocol
    trace (one ReadyForQuery from the server ends each); MySQL, the session's Questions
    (statements the client sent, not those a procedure runs; reading it is one more)."""

    def __init__(self, db: TestDatabase, conn: Connection) -> None:
        self.db = db
        self.conn = conn
        self.count = 0

    def __enter__(self) -> RoundTrips:
        if self.db.engine_name == "postgresql":
            self._trace = tempfile.TemporaryFile("w+")
            pgconn = self.conn.connection.dbapi_connection.pgconn  # type: ignore[union-attr]
            pgconn.trace(self._trace.fileno())
            pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        else:
            self._questions = self._read_questions()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.db.engine_name == "postgresql":
            pgconn = self.conn.connection.dbapi_connection.pgconn  # type: ignore[union-attr]
            pgconn.untrace()
            self._trace.seek(0)
            # One line per message: direction, length, type, fields.
            self.count = sum(
                1 for line in self._trace if line.startswith("B\t") and "\tReadyForQuery" in line
            )
            self._trace.close()
        else:
            self.count = self._read_questions() - self._questions - 1

    def _read_questions(self) -> int:
        cursor = self.conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute("SHOW SESSION STATUS LIKE 'Questions'")
            return int(cursor.fetchone()[1])
        finally:
            cursor.close()


def test_the_default_path_sends_one_round_trip_per_call(app: TestDatabase) -> None:
    """In the caller's transaction, with the default savepoint, each register_event and
    register_events is one round trip on the wire, on both engines, a failed one too:
    no SAVEPOINT, RELEASE or ROLLBACK TO, nothing to read the schema (after the first
    call), nothing to set. Nothing listens to the connection, so this is the lean path
    users run."""
    with app.engine.connect() as conn:
        conn.begin()
        # The transaction begun, the schema checked; and psycopg prepares a statement on its
        # fifth execution on a connection (prepare_threshold), in a round trip of its own,
        # once per connection and statement, not per call.
        for _ in range(6):
            assetq.register_event(conn, "orders")
        with RoundTrips(app, conn) as wire:
            for n in range(5):
                assetq.register_event(conn, "orders", extra={"n": n})
        assert wire.count == 5
        with RoundTrips(app, conn) as wire:
            assetq.register_events(conn, [assetq.NewEvent("orders")] * 3)
            assetq.register_event(conn, "regions", partition_key="eu-west-1")  # a batch of 1
        assert wire.count == 2
        with RoundTrips(app, conn) as wire:
            with pytest.raises(assetq.UnknownAsset):
                assetq.register_event(conn, "no_such_asset")
            with pytest.raises(assetq.IdempotencyConflict):
                assetq.register_events(
                    conn, [assetq.NewEvent("orders", idempotency_key="k1", extra={"n": 9})]
                )
        assert wire.count == 2
        conn.commit()
