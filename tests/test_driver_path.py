"""A worker's per-run calls (claim_runs, heartbeat, complete_run) on PostgreSQL go straight
through the driver's cursor when nothing listens to the connection's statements
(dialects._PostgreSQL.execute); with a listener they go through SQLAlchemy. Both ways give
the same results, a listener sees every call, and a connection lost on the driver path is
thrown out of the pool like one lost under SQLAlchemy."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
import assetq.dialects
from dbs import TestDatabase
from work_scenario import make_runs

WORKER_CALLS = ("claim_runs", "heartbeat_run", "complete_run")


def _work_one(engine: sa.Engine, worker: str) -> tuple[assetq.Claim, assetq.Claim, assetq.Run]:
    (claim,) = assetq.claim_runs(engine, worker, lease=timedelta(seconds=30))
    renewed = assetq.heartbeat(engine, claim, lease=timedelta(seconds=60))
    with engine.begin() as conn:
        info = assetq.complete_run(conn, renewed, "success")
    return claim, renewed, info


def _shape(value: object) -> dict[str, str]:
    """Field name -> type name: what a caller can rely on, whichever run it is."""
    return {k: type(v).__name__ for k, v in vars(value).items()}


def test_with_and_without_a_statement_listener_the_calls_give_the_same_results(
    db: TestDatabase,
) -> None:
    make_runs(db, 2)
    plain = db.new_engine()
    listened = db.new_engine()
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.extend(name for name in WORKER_CALLS if name in statement)

    sa.event.listen(listened, "before_cursor_execute", record)
    first = _work_one(plain, "w-plain")
    second = _work_one(listened, "w-listened")
    assert seen == list(WORKER_CALLS)  # the listener saw each call, in order
    for a, b in zip(first, second, strict=True):
        assert _shape(a) == _shape(b)
    claim, renewed, info = first
    assert (claim.attempt, claim.worker, claim.state) == (1, "w-plain", "running")
    assert renewed.lease_until > claim.lease_until
    assert (info.state, info.attempt, info.worker) == ("success", 1, "w-plain")
    assert info.id == claim.id and claim.event_ids == second[0].event_ids


@pytest.mark.engines("postgresql")
def test_without_a_listener_the_calls_bypass_sqlalchemy_execution(
    db: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """White box: the SQLAlchemy path (Dialect.execute) is not taken for a worker's calls
    on PostgreSQL, and is for everything else."""
    make_runs(db, 1)
    through_sqlalchemy: list[str] = []
    base = assetq.dialects.Dialect.execute

    def counted(self: Any, conn: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        through_sqlalchemy.append(name)
        return base(self, conn, name, *args, **kwargs)

    monkeypatch.setattr(assetq.dialects.Dialect, "execute", counted)
    engine = db.new_engine()
    _work_one(engine, "w")
    assert not set(WORKER_CALLS) & set(through_sqlalchemy), through_sqlalchemy
    with engine.connect() as conn:
        assetq.runs(conn, "job_000")
    assert "runs" in " ".join(through_sqlalchemy)  # the rest still goes through SQLAlchemy


@pytest.mark.engines("postgresql")
@pytest.mark.parametrize("warmed", [False, True], ids=["first-call", "lean-path"])
def test_a_connection_lost_on_the_driver_path_is_replaced_and_the_claim_retried(
    db: TestDatabase, warmed: bool
) -> None:
    """The only pooled connection is terminated by the server before a claim: the claim's
    first attempt fails on it with the driver's error, which must come out as assetq's
    ConnectionLost (retried) and not as a raw psycopg error, the connection is thrown out of
    the pool, and the retry claims on a new connection. ``warmed``: the schema was checked by
    an earlier call, so the claim takes the lean path (the driver's connection straight
    from the pool, no SQLAlchemy Connection)."""
    make_runs(db, 1)
    engine = db.new_engine(pool_size=1, max_overflow=0)
    if warmed:
        _warm(engine)
    with engine.connect() as conn:
        old_pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
    db.scalar(f"SELECT pg_terminate_backend({int(old_pid)})")
    (claim,) = assetq.claim_runs(engine, "w")
    assert claim.attempt == 1
    with engine.connect() as conn:
        new_pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
    assert new_pid != old_pid


def _warm(engine: sa.Engine) -> None:
    """The first call of a process checks the schema through SQLAlchemy (one statement);
    only the calls after it take the lean path."""
    assert assetq.claim_runs(engine, "warm-up", dag_ids=["nobody"]) == []


# -- the lean path: a claim, a heartbeat, a completion on an Engine (issue 12) -------------------


@pytest.mark.engines("postgresql")
def test_after_the_first_call_an_engines_calls_make_no_sqlalchemy_connection(
    db: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """White box: claim_runs, heartbeat and complete_run on an Engine take the driver's
    connection straight from the pool (Engine.raw_connection), never Engine.connect."""
    make_runs(db, 1)
    engine = db.new_engine(pool_size=1, max_overflow=0)
    _warm(engine)
    connects: list[str] = []
    real_connect = sa.Engine.connect

    def counted(self: sa.Engine) -> sa.Connection:
        connects.append("connect")
        return real_connect(self)

    monkeypatch.setattr(sa.Engine, "connect", counted)
    (claim,) = assetq.claim_runs(engine, "w", lease=timedelta(seconds=30))
    renewed = assetq.heartbeat(engine, claim, lease=timedelta(seconds=60))
    info = assetq.complete_run(engine, renewed, "success")
    assert connects == []
    assert (info.state, info.attempt, info.worker) == ("success", 1, "w")
    assert renewed.lease_until > claim.lease_until


def test_the_pooled_connection_a_call_used_is_handed_back_in_transactions(
    db: TestDatabase,
) -> None:
    """The lean path switches the pool's connection to autocommit for its call and back:
    the next user of that connection still gets a transaction, which a rollback undoes."""
    make_runs(db, 2)
    engine = db.new_engine(pool_size=1, max_overflow=0)
    _warm(engine)
    (claim,) = assetq.claim_runs(engine, "w")
    assetq.complete_run(engine, claim, "success")
    with engine.connect() as conn:  # the same, only, pooled connection
        conn.execute(
            sa.text(db.sql("UPDATE {ns}.dag SET max_active_runs = 7 WHERE dag_id = :d")),
            {"d": claim.dag_id},
        )
        conn.rollback()
    assert db.scalar("SELECT max_active_runs FROM {ns}.dag WHERE dag_id = :d", d=claim.dag_id) != 7


def test_a_completion_on_a_connection_outside_a_transaction_commits_with_its_commit(
    db: TestDatabase,
) -> None:
    """SQLAlchemy's commit-as-you-go: the call begins the Connection's transaction, as any
    statement executed on it would, and conn.commit() commits the completion. Through the
    driver path the transaction used to be the driver's alone: conn.commit() committed
    nothing and the pool's rollback undid the completion (the run stayed running)."""
    (run,) = make_runs(db, 1)
    (claim,) = assetq.claim_runs(db.engine, "w")
    with db.engine.connect() as conn:
        assert not conn.in_transaction()
        info = assetq.complete_run(conn, claim, "success")
        assert conn.in_transaction()
        conn.commit()
    assert info.state == "success"
    with db.engine.connect() as conn:
        assert assetq.get_run(conn, run.dag_id, run.run_id).state == "success"
    # And a rollback undoes it, as for any statement of the transaction.
    (claim,) = make_runs(db, 1, prefix="other") and assetq.claim_runs(db.engine, "w")
    with db.engine.connect() as conn:
        assetq.complete_run(conn, claim, "success")
        conn.rollback()
    with db.engine.connect() as conn:
        assert assetq.get_run(conn, claim.dag_id, claim.run_id).state == "running"
