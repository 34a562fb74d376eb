"""A call while a MySQL upgrade re-creates the routine is retried, not an error (issue 13).

MySQL has no CREATE OR REPLACE PROCEDURE: an upgrade (0006, 0007, 0009) or a repair drops a
routine and creates it again, and a call in between fails with error 1305 ("PROCEDURE
assetq.schedule_pass does not exist"). That is RoutineUnavailable, a TransientError: the
API's own transactions retry it with their backoff, a call in the caller's transaction raises
it for the caller to retry. The interleaving is forced: the routine is dropped before the
call starts and created again, from the packaged schema, while the call backs off.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
import sqlalchemy as sa

import assetq
from assetq import sqlfiles
from assetq.dialects import MYSQL
from dbs import TestDatabase


def _create_statement(db: TestDatabase, routine: str) -> str:
    """The routine's CREATE PROCEDURE statement in the packaged schema, for this namespace."""
    schema = sqlfiles.render(sqlfiles.read("mysql", "schema.sql"), MYSQL.quote_ns(db.namespace))
    marker = f"PROCEDURE {MYSQL.quote_ns(db.namespace)}.{routine}("
    return next(s for s in sqlfiles.split_script(schema) if marker in s)


def _mysql(db: TestDatabase) -> None:
    if db.engine_name != "mysql":
        pytest.skip("MySQL only: PostgreSQL replaces routines in place (CREATE OR REPLACE)")


def test_a_pass_while_its_routine_is_re_created_succeeds_once_it_is_back(
    db: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    _mysql(db)
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
        event = assetq.register_event(conn, "orders")
    create = _create_statement(db, "schedule_pass")
    db.execute("DROP PROCEDURE {ns}.schedule_pass")
    outcome: list[object] = []

    def scheduler() -> None:
        try:
            outcome.append(assetq.schedule(db.engine, max_attempts=20))
        except Exception as exc:  # reported by the assertion below
            outcome.append(exc)

    caplog.set_level(logging.DEBUG, logger="assetq.api")
    thread = threading.Thread(target=scheduler, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while "[1305]" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "[1305]" in caplog.text, caplog.text  # the pass met the missing routine, retries
    assert thread.is_alive() and outcome == []
    with db.engine.connect() as conn:
        conn.exec_driver_sql(create.replace("%", "%%"))
    thread.join(30)
    assert len(outcome) == 1 and not isinstance(outcome[0], Exception), outcome
    (run,) = outcome[0]  # type: ignore[misc]
    assert run.event_ids == (event.id,)


def test_a_call_in_the_callers_transaction_raises_the_transient_error(db: TestDatabase) -> None:
    _mysql(db)
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
    db.execute("DROP PROCEDURE {ns}.register_events")
    with db.engine.begin() as conn:
        conn.execute(sa.text("SELECT 1"))
        with pytest.raises(assetq.RoutineUnavailable, match="register_events") as raised:
            assetq.register_events(conn, [assetq.NewEvent("orders")])
        assert isinstance(raised.value, assetq.TransientError) and raised.value.code == "1305"
    # The caller retries its transaction once the routine is back.
    with db.engine.connect() as conn:
        conn.exec_driver_sql(_create_statement(db, "register_events").replace("%", "%%"))
    with db.engine.begin() as conn:
        (event,) = assetq.register_events(conn, [assetq.NewEvent("orders")])
    assert event.created


def test_a_missing_routine_that_is_not_assetqs_stays_a_database_error(db: TestDatabase) -> None:
    _mysql(db)
    with db.engine.connect() as conn, pytest.raises(sa.exc.DBAPIError) as raised:
        conn.execute(sa.text(db.sql("CALL {ns}.not_ours()")))
    translated = MYSQL.translate(raised.value)
    assert type(translated) is assetq.DatabaseError and translated.code == "1305"
