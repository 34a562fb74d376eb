"""Errors that leave the caller's transaction usable (issue 15, item 3).

assetq's writing functions run each routine call under a savepoint of its own (the default,
``savepoint=True``): a database-side error (unknown asset, idempotency conflict, unknown
consumer, ...) leaves the caller's transaction exactly as it was before the call, on both
engines. Each test writes a row of the caller's own first, catches the error, writes another
row, commits, and finds both rows and nothing of the failed call, through a Connection and
through an ORM Session.

Without the savepoint the engines differ, which is why it is the default: PostgreSQL aborts
the caller's whole transaction (its commit becomes a rollback), MariaDB keeps a procedure's
statements that ran before the error (a batch whose second item reuses an idempotency key
keeps the first item).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
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


def test_the_savepoint_is_released_after_a_successful_call(app: TestDatabase) -> None:
    """Many calls in one transaction leave no savepoint open (PostgreSQL slows down past 64
    open subtransactions per session): each call releases its own."""
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement.split()[0].upper())

    with app.engine.connect() as conn:
        sa.event.listen(conn, "before_cursor_execute", seen)
        with conn.begin():
            for _ in range(3):
                assetq.register_events(conn, [assetq.NewEvent("orders")])
    assert statements.count("SAVEPOINT") == 3
    assert statements.count("RELEASE") == 3


@pytest.mark.engines("mysql")
def test_mariadb_registers_one_event_without_a_savepoint(app: TestDatabase) -> None:
    """MySQL/MariaDB: register_event writes with one statement (the INSERT, its fan-out
    trigger inside it) and an error rolls back that statement only, so the caller's
    transaction is left as it was without a savepoint (the behaviour test above proves it
    for unknown assets and idempotency conflicts): none is sent, two round trips saved."""
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement.split()[0].upper())

    with app.engine.connect() as conn:
        sa.event.listen(conn, "before_cursor_execute", seen)
        with conn.begin():
            assetq.register_event(conn, "orders")
    assert "SAVEPOINT" not in statements


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
    """Forced: the server session is killed right before the routine call is sent, after the
    SAVEPOINT. Rolling back to the savepoint then fails too; the caller gets the error that
    says what happened (ConnectionLost, transient: retry the whole transaction)."""
    with app.engine.connect() as conn:
        conn.begin()

        def kill_before_the_call(c: Any, cursor: Any, statement: str, *args: Any) -> None:
            if "register_event" in statement:
                app.kill(conn)

        sa.event.listen(conn, "before_cursor_execute", kill_before_the_call)
        with pytest.raises(assetq.ConnectionLost):
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
def test_without_a_savepoint_mariadb_keeps_a_failed_batchs_first_items(app: TestDatabase) -> None:
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
    assert app.counts()["asset_event"] == before + 1  # half a batch: what the savepoint prevents
