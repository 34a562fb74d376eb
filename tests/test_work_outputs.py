"""A completion that fails commits nothing, whatever its caller does next (I9, since
development revision 0007_capped_claim).

complete_run writes in the caller's transaction: the run's output events (and their queue
rows), then its success. When it fails half-way, an output event refused after others were
inserted, nothing it wrote may reach a commit: a caller that commits anyway must not commit
output events without the run's success. PostgreSQL aborts the caller's transaction on any
error; on MySQL/MariaDB an error only ends the statement, so complete_run rolls back to a
savepoint of its own before it raises the error again. A deadlock rolls the whole
transaction back, that savepoint included: the caller must still get the deadlock, which it
retries, and not the savepoint's absence.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
import races
from dbs import TestDatabase
from work_scenario import declare, events_from, one_run, run_row

OUTPUT = "sales_report"

#: The user's own table, in the application's schema: rows a handler locks and writes.
LEDGER = "work_ledger"

#: Statements that differ between the engines: the run's row locked by a second
#: transaction, as a worker completing it would hold it.
LOCK_RUN = {
    "postgresql": "SELECT id FROM {ns}.dag_run WHERE id = :id FOR NO KEY UPDATE",
    "mysql": "SELECT id FROM {ns}.dag_run WHERE id = :id FOR UPDATE",
}


def _output_run(db: TestDatabase) -> tuple[assetq.Run, assetq.Claim]:
    """A claimed run whose outputs a consumer ("downstream") is scheduled on: an output
    event committed would leave a queue row too."""
    declare(db, "downstream", OUTPUT)
    run = one_run(db)
    (claim,) = assetq.claim_runs(db.engine, "w1")
    return run, claim


def _refused_outputs() -> list[assetq.NewEvent]:
    """Two output events with one idempotency key and different extras: the second is
    refused (AQ005) after the first was inserted and fanned out."""
    return [
        assetq.NewEvent(OUTPUT, extra={"rows": 1}, idempotency_key="report-1"),
        assetq.NewEvent(OUTPUT, extra={"rows": 2}, idempotency_key="report-1"),
    ]


def _nothing_of_the_completion(
    db: TestDatabase, run: assetq.Run, before: tuple[dict[str, int], dict[str, Any]]
) -> None:
    counts, row = before
    assert db.counts() == counts  # no event, no queue row, no link, no run
    assert run_row(db, run.dag_id, run.run_id) == row  # still running, held, not succeeded
    assert events_from(db, run.dag_id, run.run_id) == []


def test_a_completion_whose_second_output_event_is_refused_commits_nothing_when_committed(
    db: TestDatabase,
) -> None:
    run, claim = _output_run(db)
    before = db.counts(), run_row(db, run.dag_id, run.run_id)
    events = _refused_outputs()
    with db.engine.connect() as conn:
        conn.begin()
        with pytest.raises(assetq.IdempotencyConflict):
            assetq.complete_run(conn, claim, "success", events=events)
        conn.commit()  # the caller commits anyway
    _nothing_of_the_completion(db, run, before)
    # Still held at its attempt: its worker completes it, with its outputs, once.
    with db.engine.begin() as conn:
        done = assetq.complete_run(conn, claim, "success", events=events[:1])
    assert done.state == "success"
    assert events_from(db, run.dag_id, run.run_id) == list(done.output_event_ids)


@pytest.mark.engines("mysql")
def test_on_mysql_a_failed_completion_leaves_the_callers_own_writes_in_its_transaction(
    db: TestDatabase,
) -> None:
    """The caller's transaction is as it was before the call: MySQL ends the failed
    statement only, so what the caller wrote before stays and is committed with it."""
    db.execute(f"CREATE TABLE {LEDGER} (id integer PRIMARY KEY, n integer NOT NULL)")
    run, claim = _output_run(db)
    before = db.counts(), run_row(db, run.dag_id, run.run_id)
    with db.engine.connect() as conn:
        conn.begin()
        conn.execute(sa.text(f"INSERT INTO {LEDGER} (id, n) VALUES (1, 1)"))
        with pytest.raises(assetq.IdempotencyConflict):
            assetq.complete_run(conn, claim, "success", events=_refused_outputs())
        conn.commit()
    _nothing_of_the_completion(db, run, before)
    assert db.rows(f"SELECT id, n FROM {LEDGER}") == [(1, 1)]


def _wait_until_blocked(db: TestDatabase, thread: threading.Thread, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not db.scalar(races.LOCK_WAITS[db.engine_name]):
        assert thread.is_alive(), "the completion returned without waiting for the run's lock"
        assert time.monotonic() < deadline, "the completion never waited for the run's lock"
        time.sleep(races.LOCK_WAIT_POLL[db.engine_name])


def test_a_completion_chosen_as_a_deadlock_victim_raises_a_transient_error_and_commits_nothing(
    db: TestDatabase,
) -> None:
    """The worker's transaction holds a ledger row and waits in complete_run for the run's
    row, which another transaction holds while it waits for the ledger row. The worker's is
    the victim: it waited first (PostgreSQL's detector runs in the first waiter) and wrote
    less (InnoDB rolls back the smaller transaction)."""
    db.execute(f"CREATE TABLE {LEDGER} (id integer PRIMARY KEY, n integer NOT NULL)")
    db.execute(f"INSERT INTO {LEDGER} (id, n) VALUES (0, 0)")
    run, claim = _output_run(db)
    before = db.counts(), run_row(db, run.dag_id, run.run_id)
    outcome: dict[str, BaseException | assetq.Run] = {}
    with db.engine.connect() as worker, db.engine.connect() as other:
        worker.begin()
        worker.execute(sa.text(f"UPDATE {LEDGER} SET n = 1 WHERE id = 0"))
        other.begin()
        for i in range(1, 201):  # the larger transaction of the two
            other.execute(sa.text(f"INSERT INTO {LEDGER} (id, n) VALUES (:i, 0)"), {"i": i})
        other.execute(sa.text(db.sql(LOCK_RUN[db.engine_name])), {"id": run.id})

        def complete() -> None:
            try:
                outcome["result"] = assetq.complete_run(
                    worker, claim, "success", events=[assetq.NewEvent(OUTPUT)]
                )
            except BaseException as exc:  # reported below
                outcome["result"] = exc
            try:
                worker.commit()  # the caller commits anyway
            except BaseException as exc:  # reported below
                outcome["commit"] = exc

        thread = threading.Thread(target=complete)
        thread.start()
        _wait_until_blocked(db, thread)
        other.execute(sa.text(f"UPDATE {LEDGER} SET n = 2 WHERE id = 0"))  # closes the cycle
        other.rollback()
        thread.join(timeout=60)
        assert not thread.is_alive()
    result = outcome["result"]
    assert isinstance(result, assetq.TransientError), result
    assert "commit" not in outcome, outcome
    _nothing_of_the_completion(db, run, before)
    assert db.rows(f"SELECT n FROM {LEDGER} WHERE id = 0") == [(0,)]  # rolled back whole
    with db.engine.begin() as conn:  # the retry the error asks for
        assert assetq.complete_run(conn, claim, "success").state == "success"


@pytest.mark.engines("mysql")
def test_on_mysql_a_deadlock_inside_a_routine_takes_the_routines_savepoint_with_it(
    db: TestDatabase,
) -> None:
    """Why complete_run's handler ignores error 1305: after a deadlock (1213) the whole
    transaction is rolled back, so ROLLBACK TO SAVEPOINT in the routine's handler fails with
    1305 (savepoint does not exist), and a handler that did not ignore it would raise that
    instead of the deadlock, which no caller retries."""
    db.execute(f"CREATE TABLE {LEDGER} (id integer PRIMARY KEY, n integer NOT NULL)")
    db.execute(f"INSERT INTO {LEDGER} (id, n) VALUES (0, 0), (-1, 0)")
    db.execute(
        f"CREATE PROCEDURE aqcc_naive() BEGIN"
        f" DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK TO SAVEPOINT s; RESIGNAL; END;"
        f" SAVEPOINT s; UPDATE {LEDGER} SET n = 1 WHERE id = -1; RELEASE SAVEPOINT s; END"
    )
    outcome: dict[str, BaseException | None] = {}
    with db.engine.connect() as victim, db.engine.connect() as other:
        victim.begin()
        victim.execute(sa.text(f"UPDATE {LEDGER} SET n = 1 WHERE id = 0"))
        other.begin()
        for i in range(1, 201):
            other.execute(sa.text(f"INSERT INTO {LEDGER} (id, n) VALUES (:i, 0)"), {"i": i})
        other.execute(sa.text(f"UPDATE {LEDGER} SET n = 2 WHERE id = -1"))

        def call() -> None:
            try:
                victim.execute(sa.text("CALL aqcc_naive()"))
                outcome["error"] = None
            except sa.exc.DBAPIError as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=call)
        thread.start()
        _wait_until_blocked(db, thread)
        other.execute(sa.text(f"UPDATE {LEDGER} SET n = 2 WHERE id = 0"))
        other.rollback()
        thread.join(timeout=60)
        victim.rollback()
    error = outcome["error"]
    assert isinstance(error, sa.exc.DBAPIError)
    assert error.orig is not None
    assert error.orig.args[0] == 1305, error  # not 1213: the deadlock is lost
