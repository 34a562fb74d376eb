"""complete_run on an Engine: a completion that is a transaction of its own (issue 12).

A worker whose handler wrote nothing to the database (it called another service, wrote a
file) has nothing to commit with its run's success. ``complete_run(engine, claim, ...)``
completes it in a short transaction of its own, with its output events: on PostgreSQL one
statement on an autocommit connection (a single round trip, against three with
``engine.begin()``). Fencing is the same (LeaseLost, nothing written). A deadlock is
retried; a lost connection is not, since the completion may have committed before the
connection was lost: the caller gets ConnectionLost and reads the run.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy as sa
from test_work_outputs import LOCK_RUN

import assetq
import races
from dbs import TestDatabase
from work_scenario import declare, events_from, expire_lease, one_run, run_row, wait_for

OUTPUT = "sales_report"

#: Whether session ``pid`` is still there.
SESSION_ALIVE = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity WHERE pid = :pid",
    "mysql": "SELECT count(*) FROM information_schema.PROCESSLIST WHERE ID = :pid",
}

#: Whether session ``pid`` waits for a lock.
LOCK_WAITING = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"
    " AND wait_event_type = 'Lock'",
    "mysql": "SELECT count(*) FROM information_schema.INNODB_TRX"
    " WHERE trx_mysql_thread_id = :pid AND trx_state = 'LOCK WAIT'",
}


def test_a_completion_on_an_engine_commits_the_success_and_its_outputs_by_itself(
    db: TestDatabase,
) -> None:
    declare(db, "downstream", OUTPUT)
    run = one_run(db)
    (claim,) = assetq.claim_runs(db.engine, "w1")
    before = db.counts()
    info = assetq.complete_run(
        db.engine, claim, "success", events=[assetq.NewEvent(OUTPUT, extra={"rows": 3})]
    )
    assert (info.state, info.attempt, info.worker) == ("success", 1, "w1")
    assert len(info.output_event_ids) == 1
    # Committed: another connection sees the success, the output event and its queue row.
    assert run_row(db, run.dag_id, run.run_id)["state"] == "success"
    assert events_from(db, run.dag_id, run.run_id) == list(info.output_event_ids)
    queued = db.rows("SELECT target_dag_id, asset_event_id FROM {ns}.asset_dag_run_queue")
    assert [tuple(r) for r in queued] == [("downstream", info.output_event_ids[0])]
    after = db.counts()
    assert after["asset_event"] == before["asset_event"] + 1


def test_a_failed_completion_on_an_engine_queues_the_retry(db: TestDatabase) -> None:
    run = one_run(db, max_attempts=2)
    (claim,) = assetq.claim_runs(db.engine, "w1")
    info = assetq.complete_run(db.engine, claim, "failed", error="boom")
    assert (info.state, info.attempt, info.error) == ("queued", 1, "boom")
    (again,) = assetq.claim_runs(db.engine, "w2")
    assert (again.run_id, again.attempt, again.event_ids) == (run.run_id, 2, run.event_ids)


def test_a_completion_on_an_engine_of_a_lost_lease_raises_lease_lost_and_writes_nothing(
    db: TestDatabase,
) -> None:
    declare(db, "downstream", OUTPUT)
    run = one_run(db, max_attempts=3)
    (old,) = assetq.claim_runs(db.engine, "w1")
    expire_lease(db, old.id)
    (new,) = assetq.claim_runs(db.engine, "w2")
    assert new.attempt == 2
    counts, row = db.counts(), run_row(db, run.dag_id, run.run_id)
    with pytest.raises(assetq.LeaseLost):
        assetq.complete_run(db.engine, old, "success", events=[assetq.NewEvent(OUTPUT)])
    assert db.counts() == counts
    assert run_row(db, run.dag_id, run.run_id) == row  # w2 still holds attempt 2


def test_a_completion_on_an_engine_whose_connection_is_lost_is_not_sent_again(
    db: TestDatabase,
) -> None:
    """The completion waits for the run's row (locked by a second transaction) when its
    connection is killed. The lock is released before the caller returns: had the call been
    sent again, that retry would have found the row free and completed the run."""
    run = one_run(db)
    engine = db.new_engine(pool_size=1, max_overflow=0)
    (claim,) = assetq.claim_runs(engine, "w1")
    with engine.connect() as conn:  # the pool's one connection, which completes below
        pid = conn.execute(db.engine_sql("backend_id")).scalar()
    outcome: dict[str, Any] = {}

    def complete() -> None:
        try:
            outcome["info"] = assetq.complete_run(engine, claim, "success")
        except Exception as exc:  # reported to the test below
            outcome["error"] = exc

    with db.engine.connect() as locker:
        with locker.begin():
            locker.execute(sa.text(db.sql(LOCK_RUN[db.engine_name])), {"id": claim.id})
            worker = threading.Thread(target=complete)
            worker.start()
            wait_for(
                "the completion to wait for the run's row",
                lambda: db.scalar(LOCK_WAITING[db.engine_name], pid=pid) == 1,
                every=races.LOCK_WAIT_POLL[db.engine_name],
            )
            with db.engine.begin() as killer:
                killer.execute(db.engine_sql("kill"), {"pid": pid})
        # The row is free now: a retry of the call, sent before or after this point, would
        # complete the run before the caller returns.
        worker.join(30)
    assert not worker.is_alive()
    assert isinstance(outcome.get("error"), assetq.ConnectionLost), outcome
    row = run_row(db, run.dag_id, run.run_id)
    assert (row["state"], row["attempt"], row["worker"]) == ("running", 1, "w1")
    # The run is still held at attempt 1: the worker may complete it again, and does.
    info = assetq.complete_run(engine, claim, "success")
    assert info.state == "success"
    engine.dispose()


def test_an_engine_completion_is_refused_for_what_is_neither_and_says_what_to_pass() -> None:
    with pytest.raises(assetq.InvalidArgumentType, match="Connection, an ORM Session or an Engine"):
        assetq.complete_run(object(), object(), "success")  # type: ignore[arg-type]


# -- a worker's own connection, in autocommit mode --------------------------------------------


def _own(engine: sa.Engine) -> sa.Connection:
    return engine.connect().execution_options(isolation_level="AUTOCOMMIT")


def test_a_worker_claims_renews_and_completes_on_an_autocommit_connection_it_keeps(
    db: TestDatabase,
) -> None:
    """Each call is a transaction of its own on the connection: committed when it returns
    (another connection sees it), and the connection is left outside any transaction."""
    declare(db, "downstream", OUTPUT)
    run = one_run(db)
    with _own(db.engine) as conn:
        (claim,) = assetq.claim_runs(conn, "w1")
        assert not conn.in_transaction()
        assert run_row(db, run.dag_id, run.run_id)["state"] == "running"  # committed
        renewed = assetq.heartbeat(conn, claim)
        assert renewed.lease_until > claim.lease_until
        info = assetq.complete_run(conn, renewed, "success", events=[assetq.NewEvent(OUTPUT)])
        assert not conn.in_transaction()
        assert run_row(db, run.dag_id, run.run_id)["state"] == "success"
        assert events_from(db, run.dag_id, run.run_id) == list(info.output_event_ids)
        with conn.begin():  # nothing SQLAlchemy thinks is still open
            pass
        assert assetq.claim_runs(conn, "w1") == []


def test_calls_that_commit_by_themselves_refuse_a_connection_in_transactions(
    db: TestDatabase,
) -> None:
    run = one_run(db)
    with db.engine.connect() as conn:
        for call in (
            lambda: assetq.claim_runs(conn, "w1"),
            lambda: assetq.heartbeat(conn, object()),  # type: ignore[arg-type]
        ):
            with pytest.raises(assetq.InvalidArgumentType, match="autocommit mode") as raised:
                call()
            assert raised.value.code == "AQ101"
    assert run_row(db, run.dag_id, run.run_id)["state"] == "queued"  # nothing claimed


def test_a_claim_on_a_kept_connection_that_was_lost_is_not_retried_on_it(
    db: TestDatabase,
) -> None:
    """The connection is the caller's: a claim that finds it dead raises ConnectionLost at
    once (no retry, nothing claimed), and the worker connects again."""
    run = one_run(db)
    engine = db.new_engine()
    conn = _own(engine)
    assert assetq.claim_runs(conn, "w1", dag_ids=["nobody"]) == []  # schema checked
    pid = conn.execute(db.engine_sql("backend_id")).scalar()
    conn.commit()  # the autobegin marker of that statement (autocommit: nothing to commit)
    with db.engine.begin() as killer:
        killer.execute(db.engine_sql("kill"), {"pid": pid})
    # The kill only asks the server to end the session: the claim must not start before it
    # has ended (PostgreSQL's pg_terminate_backend returns first).
    wait_for(
        "the killed session to end",
        lambda: db.scalar(SESSION_ALIVE[db.engine_name], pid=pid) == 0,
    )
    with pytest.raises(assetq.ConnectionLost):
        assetq.claim_runs(conn, "w1")
    conn.close()
    assert run_row(db, run.dag_id, run.run_id)["state"] == "queued"
    with _own(engine) as again:
        (claim,) = assetq.claim_runs(again, "w1")
    assert (claim.run_id, claim.attempt) == (run.run_id, 1)
