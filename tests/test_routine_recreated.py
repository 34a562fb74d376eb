"""A call while MySQL re-creates its routine is retried, not an error (issue 13).

MySQL proper has no CREATE OR REPLACE PROCEDURE: a sync (assetq install, upgrade or repair,
assetq.routines) that re-creates a routine drops it and creates it again from its file
(routines.replaces_atomically is False there), and a call in between fails with error 1305
("PROCEDURE assetq.schedule_pass_v2 does not exist"). So does any call after someone dropped it
by hand. That is RoutineUnavailable, a TransientError: the API's own transactions retry it
with their backoff, a call in the caller's transaction raises it for the caller to retry.
The interleaving is forced: the routine is dropped before the call starts and created again,
from its file, while the call backs off; or a repair on MySQL's path (forced on the suite's
MariaDB, which itself replaces in one statement: tests/test_trigger_swap.py) is held between
its DROP and its CREATE until the pass has met the missing routine.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Connection

import assetq
from assetq import migrate, routines, sqlfiles
from assetq.dialects import MYSQL
from dbs import TestDatabase


def _create_statement(db: TestDatabase, routine: str) -> str:
    """The CREATE PROCEDURE statement of the routine's file, for this namespace."""
    script = sqlfiles.render(
        sqlfiles.read("mysql", f"routines/{routine}.sql"), MYSQL.quote_ns(db.namespace)
    )
    (create,) = [s for s in sqlfiles.split_script(script) if s.lstrip().startswith("CREATE")]
    assert f"PROCEDURE {MYSQL.quote_ns(db.namespace)}.{routine}(" in create, create
    return create


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
    create = _create_statement(db, "schedule_pass_v2")
    db.execute("DROP PROCEDURE {ns}.schedule_pass_v2")
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
    db.execute("DROP PROCEDURE {ns}.register_events_v2")
    with db.engine.begin() as conn:
        conn.execute(sa.text("SELECT 1"))
        with pytest.raises(assetq.RoutineUnavailable, match="register_events_v2") as raised:
            assetq.register_events(conn, [assetq.NewEvent("orders")])
        assert isinstance(raised.value, assetq.TransientError) and raised.value.code == "1305"
    # The caller retries its transaction once the routine is back.
    with db.engine.connect() as conn:
        conn.exec_driver_sql(_create_statement(db, "register_events_v2").replace("%", "%%"))
    with db.engine.begin() as conn:
        (event,) = assetq.register_events(conn, [assetq.NewEvent("orders")])
    assert event.created


def test_a_missing_routine_that_is_not_assetqs_stays_a_database_error(db: TestDatabase) -> None:
    _mysql(db)
    with db.engine.connect() as conn, pytest.raises(sa.exc.DBAPIError) as raised:
        conn.execute(sa.text(db.sql("CALL {ns}.not_ours()")))
    translated = MYSQL.translate(raised.value)
    assert type(translated) is assetq.DatabaseError and translated.code == "1305"


def _met_the_missing_routine(caplog: pytest.LogCaptureFixture, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while "[1305]" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.01)
    return "[1305]" in caplog.text


def _scheduled(db: TestDatabase) -> object:
    try:
        return assetq.schedule(db.engine, max_attempts=20)
    except Exception as exc:  # reported by the test's assertion
        return exc


def test_a_pass_during_a_repair_on_mysqls_path_succeeds_once_its_routine_is_back(
    db: TestDatabase, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """schedule_pass_v2 (the routine a pass calls) recorded from another file (as after a
    package upgrade that changed it): the repair drops it and creates it again, and a pass
    started between the two meets 1305, backs off, and makes its run once the routine is
    back."""
    _mysql(db)
    monkeypatch.setattr(routines, "replaces_atomically", lambda conn: False)
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
        event = assetq.register_event(conn, "orders")
    db.execute(
        "UPDATE {ns}.routine_catalogue SET checksum = 'another file'"
        " WHERE kind = 'routine' AND name = 'schedule_pass_v2'"
    )
    outcome: list[object] = []
    scheduler = threading.Thread(
        target=lambda: outcome.append(_scheduled(db)), daemon=True, name="scheduler"
    )
    original: Callable[..., None] = type(MYSQL).run_statements

    def held(self: Any, conn: Connection, statements: Sequence[str]) -> None:
        """The repair's statements one by one; after DROP PROCEDURE schedule_pass_v2, the pass
        runs until it has met the missing routine, then the CREATE follows."""
        for statement in statements:
            original(self, conn, [statement])
            if statement.startswith("DROP PROCEDURE") and "schedule_pass_v2" in statement:
                scheduler.start()
                assert _met_the_missing_routine(caplog), caplog.text
                assert scheduler.is_alive() and outcome == []

    caplog.set_level(logging.DEBUG, logger="assetq.api")
    monkeypatch.setattr(type(MYSQL), "run_statements", held)
    assert migrate.repair(db.engine, namespace=db.namespace) == ["routine schedule_pass_v2"]
    scheduler.join(30)
    assert len(outcome) == 1 and not isinstance(outcome[0], Exception), outcome
    (run,) = outcome[0]  # type: ignore[misc]
    assert run.event_ids == (event.id,)
