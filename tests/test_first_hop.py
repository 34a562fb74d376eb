"""The first hop in one step (issue 26): a worker claims with a pass of its own consumers first
(``claim_runs(schedule=True)``, routine schedule_and_claim), so the run a producer's event
makes is claimed in the transaction that makes it.

What is proven here, on both engines unless marked: the pass is the scheduler's (the same
runs, events linked exactly once), it touches only the worker's consumers, and it waits for a
consumer another pass holds and then claims that pass's run (the race forced: the other pass
is left open in a transaction while the claim runs in a thread). On PostgreSQL: a worker
woken by a producer's notification makes and claims the run with no scheduler pass at all;
the runs it claims wake no other worker, those it leaves do; and its commit does not wait for
the disk (its transaction is lost whole in a crash, and a durable commit after it keeps it),
shown on a throw-away server whose WAL writer is stopped, with a real immediate shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

import assetq
from assetq import aio
from dbs import TestDatabase
from history import add_history
from races import blocked_or_done, in_thread
from servers import lone_postgres
from work_scenario import declare, expire_lease, register, run_events, run_row, wait_for


def _queue(db: TestDatabase) -> list[tuple[str, int]]:
    return [
        (str(r[0]), int(r[1]))
        for r in db.rows(
            "SELECT target_dag_id, asset_event_id FROM {ns}.asset_dag_run_queue ORDER BY 1, 2"
        )
    ]


def test_a_claim_with_a_pass_makes_and_claims_the_run_of_queued_events(db: TestDatabase) -> None:
    declare(db, "report", "orders")
    events = register(db, "orders", "orders")
    (claim,) = assetq.claim_runs(db.engine, "w1", dag_ids=["report"], schedule=True)
    assert (claim.dag_id, claim.state, claim.attempt, claim.worker) == (
        "report",
        "running",
        1,
        "w1",
    )
    assert claim.event_ids == tuple(sorted(e.id for e in events))
    assert run_events(db, "report", claim.run_id) == claim.event_ids
    assert _queue(db) == []
    # What the scheduler would have made: the same run, seq 1, nothing left to pass.
    assert claim.seq == 1 and assetq.schedule(db.engine) == []
    # Nothing queued: the next claim with a pass finds nothing and writes nothing.
    assert assetq.claim_runs(db.engine, "w1", dag_ids=["report"], schedule=True) == []


def test_the_pass_is_of_the_workers_consumers_only(db: TestDatabase) -> None:
    declare(db, "mine", "orders")
    declare(db, "theirs", "orders")
    (event,) = register(db, "orders")
    (claim,) = assetq.claim_runs(db.engine, "w1", dag_ids=["mine"], schedule=True)
    assert claim.dag_id == "mine"
    # The other consumer's row is still queued, for its own worker or a scheduler.
    assert _queue(db) == [("theirs", event.id)]
    (run,) = assetq.schedule(db.engine)
    assert run.dag_id == "theirs" and run.event_ids == (event.id,)


def test_older_claimable_runs_are_claimed_first(db: TestDatabase) -> None:
    """The pass's run waits behind a run queued before it (claims are oldest first)."""
    declare(db, "report", "orders")
    register(db, "orders")
    (older,) = assetq.schedule(db.engine)
    register(db, "orders")
    (claim,) = assetq.claim_runs(db.engine, "w1", dag_ids=["report"], schedule=True)
    assert claim.run_id == older.run_id
    (newer,) = assetq.claim_runs(db.engine, "w1", dag_ids=["report"])
    assert newer.seq == older.seq + 1


def _counted(
    db: TestDatabase, conn: sa.Connection, statement: str, counters: tuple[str, str]
) -> tuple[list[Any], tuple[int, int]]:
    """``statement``'s rows, and how much it moved two of dag_run's counters in
    pg_stat_xact_user_tables, in a READ COMMITTED transaction of its own on ``conn``. Taken
    before and after: the session's counts not yet reported (PostgreSQL 15 reports them at
    most once a second) are in the view too."""
    query = sa.text(
        f"SELECT {counters[0]}, {counters[1]} FROM pg_stat_xact_user_tables"
        " WHERE schemaname = :ns AND relname = 'dag_run'"
    )
    conn.begin()
    conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
    before = conn.execute(query, {"ns": db.namespace}).one()
    rows = list(conn.execute(sa.text(db.sql(statement))).all())
    after = conn.execute(query, {"ns": db.namespace}).one()
    conn.commit()
    return rows, (after[0] - before[0], after[1] - before[1])


@pytest.mark.engines("postgresql")
def test_the_run_a_claim_with_a_pass_makes_is_written_once(db: TestDatabase) -> None:
    """PostgreSQL: the pass's run is inserted claimed (schedule_runs with the worker, the pass
    schedule_and_claim runs), not inserted queued and then updated by the claim (an update
    writes a new version of the row and an entry in each of dag_run's indexes). Counted in
    the pass's own transaction. (schedule_and_claim may write the run once more, to start a
    slow pass's clock again at its end: the next test.)"""
    declare(db, "report", "orders", timeout=30)
    register(db, "orders")
    with db.engine.connect() as conn:
        (row,), written = _counted(
            db,
            conn,
            "SELECT * FROM {ns}.schedule_runs(100, '[\"report\"]', 0, 'w1', 60, NULL)",
            ("n_tup_ins", "n_tup_upd"),
        )
    assert written == (1, 0)
    assert (row.state, row.capped) == ("running", False)
    assert (row.deadline - row.created_at).total_seconds() == 30
    stored = db.rows(
        "SELECT state, attempt, worker, started_at, deadline, lease_until, not_before"
        " FROM {ns}.dag_run WHERE id = :id",
        id=row.dag_run_id,
    )[0]
    assert tuple(stored) == (
        "running",
        1,
        "w1",
        row.created_at,
        row.deadline,
        row.deadline,
        row.deadline,
    )


@pytest.mark.engines("postgresql")
def test_a_workers_claims_with_a_pass_never_read_the_run_history(db: TestDatabase) -> None:
    """PostgreSQL: the pass's look for older claimable runs of the worker's consumers (before
    it inserts its run claimed) goes through the claim index, whatever plan PL/pgSQL keeps.
    As an EXISTS, the plan the session settled on after its fifth call read all of dag_run
    (a worker's connection makes thousands of these calls: 0.3 ms of a 1.5 ms first hop with
    1,800 runs). Counted in each call's own transaction on one connection, as a worker keeps
    it, with 5,000 finished runs in the history."""
    declare(db, "report", "orders")
    add_history(db.engine, 20_000)
    reads = []
    with db.engine.connect() as conn:
        for _ in range(8):
            register(db, "orders")
            (row,), read = _counted(
                db,
                conn,
                "SELECT * FROM {ns}.schedule_and_claim('w1', 1, 60, '[\"report\"]')",
                ("seq_scan", "seq_tup_read"),
            )
            assert (row.state, row.made) == ("running", True)
            reads.append(read)
    assert reads == [(0, 0)] * 8


@pytest.mark.parametrize(
    ("consumer_timeout", "worker_timeout", "lease", "deadline", "lease_until"),
    [
        (None, None, 60, None, 60),
        (30, None, 60, 30, 30),  # the lease never runs past the deadline
        (None, 10, 60, 10, 10),  # the worker's default for a consumer that declares none
        (120, 10, 60, 120, 60),  # the consumer's own timeout first
    ],
)
def test_a_claim_with_a_pass_gets_the_deadline_and_lease_of_any_claim(
    db: TestDatabase,
    consumer_timeout: int | None,
    worker_timeout: int | None,
    lease: int,
    deadline: int | None,
    lease_until: int,
) -> None:
    """The run made and claimed by one statement has the deadline and lease claim_runs gives
    (claim_runs_v2), from its claim time: the same fields, the same rules."""
    options = {} if consumer_timeout is None else {"timeout": consumer_timeout}
    declare(db, "report", "orders", **options)
    register(db, "orders")
    (claim,) = assetq.claim_runs(
        db.engine, "w1", dag_ids=["report"], lease=lease, timeout=worker_timeout, schedule=True
    )
    assert claim.started_at is not None
    if deadline is None:
        assert claim.deadline is None
    else:
        assert claim.deadline is not None
        assert (claim.deadline - claim.started_at).total_seconds() == deadline
    assert (claim.lease_until - claim.started_at).total_seconds() == lease_until
    stored = db.rows(
        "SELECT started_at, deadline, lease_until, not_before FROM {ns}.dag_run WHERE run_id = :r",
        r=claim.run_id,
    )[0]
    assert stored.lease_until == stored.not_before
    # And a heartbeat and a success of that claim are those of any claim.
    assetq.heartbeat(db.engine, claim)
    with db.engine.begin() as conn:
        run = assetq.complete_run(conn, claim, "success")
    assert run.state == "success"


@pytest.mark.engines("postgresql")
def test_a_run_claimed_by_a_slow_pass_gets_its_clock_from_the_end_of_the_pass(
    db: TestDatabase,
) -> None:
    """PostgreSQL: the run is inserted claimed before the pass links its events; a pass that
    goes on for more than a few milliseconds after it (here: 10,000 events to link) starts
    the attempt's clock again at its end, so the deadline and the lease are whole from the
    claim the worker gets, as claim_runs_v2's are."""
    declare(db, "report", "orders", timeout=30)
    with db.engine.begin() as conn:
        assetq.register_events(conn, [{"asset": "orders"}] * 10_000)
    (claim,) = assetq.claim_runs(db.engine, "w1", dag_ids=["report"], lease=60, schedule=True)
    assert len(claim.event_ids) == 10_000
    assert claim.started_at is not None and claim.deadline is not None
    assert claim.started_at > claim.created_at
    assert (claim.deadline - claim.started_at).total_seconds() == 30
    assert claim.lease_until == claim.deadline
    stored = db.rows(
        "SELECT started_at, deadline, lease_until, not_before FROM {ns}.dag_run WHERE id = :id",
        id=claim.id,
    )[0]
    assert tuple(stored) == (claim.started_at, claim.deadline, claim.deadline, claim.deadline)
    with db.engine.begin() as conn:
        assert assetq.complete_run(conn, claim, "success").state == "success"


def test_an_expired_last_attempt_is_failed_before_the_pass_run_is_claimed(
    db: TestDatabase,
) -> None:
    """A run of the worker's consumers whose lease expired on its last attempt is claimable:
    the claim with a pass fails it (I10), as any claim does, and then claims the pass's run,
    which is written once more (inserted queued, then claimed) on PostgreSQL."""
    declare(db, "report", "orders", max_attempts=1)
    register(db, "orders")
    (stale,) = assetq.claim_runs(db.engine, "w1", dag_ids=["report"], schedule=True)
    expire_lease(db, stale.id)
    register(db, "orders")
    (claim,) = assetq.claim_runs(db.engine, "w2", dag_ids=["report"], schedule=True)
    assert (claim.seq, claim.attempt, claim.worker) == (stale.seq + 1, 1, "w2")
    failed = run_row(db, "report", stale.run_id)
    assert failed["state"] == "failed" and "expired" in failed["error"]


def test_bad_input_is_refused_before_anything_is_written(db: TestDatabase) -> None:
    declare(db, "report", "orders")
    register(db, "orders")
    with pytest.raises(assetq.InvalidArgumentType):
        assetq.claim_runs(db.engine, "w1", schedule="yes")  # type: ignore[arg-type]
    # NaN too where the driver can send it (PyMySQL refuses it itself).
    for wait in (-1, 61, *([float("nan")] if db.engine_name == "postgresql" else [])):
        with pytest.raises(sa.exc.DBAPIError, match="wait must be 0 to 60 seconds"):
            db.execute(
                "CALL {ns}.schedule_and_claim('w1', 1, 60, NULL, NULL, :wait)"
                if db.engine_name == "mysql"
                else "SELECT * FROM {ns}.schedule_and_claim('w1', 1, 60, NULL, NULL, :wait)",
                wait=wait,
            )
    with pytest.raises(sa.exc.DBAPIError, match="dag_ids must be a JSON array"):
        db.execute(
            "CALL {ns}.schedule_and_claim('w1', 1, 60, '{\"a\": 1}', NULL, 0)"
            if db.engine_name == "mysql"
            else "SELECT * FROM {ns}.schedule_and_claim('w1', 1, 60, '{\"a\": 1}', NULL, 0)"
        )
    assert len(_queue(db)) == 1
    assert db.scalar("SELECT count(*) FROM {ns}.dag_run") == 0


def _open_pass(db: TestDatabase, conn: sa.Connection) -> list[Any]:
    """A scheduler's pass left open in ``conn``'s transaction: it holds the consumers it took
    until the test commits or rolls back."""
    if db.engine_name == "mysql":
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        return list(conn.execute(sa.text(db.sql("CALL {ns}.schedule_pass_v2(100, NULL, 0)"))))
    conn.begin()
    conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return list(conn.execute(sa.text(db.sql("SELECT * FROM {ns}.schedule_pass_v2(100, NULL, 0)"))))


def test_a_consumer_another_pass_holds_is_waited_for_and_its_run_claimed(db: TestDatabase) -> None:
    """The race a worker woken with a scheduler loses: the scheduler's pass holds the
    consumer (open, not committed) when the worker's claim with a pass starts. The claim
    waits, and once the pass commits it claims the run that pass made: no run is made twice,
    no event is linked twice, and the worker does not wait for another notification."""
    declare(db, "report", "orders")
    events = register(db, "orders")
    with db.engine.connect() as holder:
        (made,) = _open_pass(db, holder)
        thread, outcome = in_thread(
            lambda: assetq.claim_runs(db.engine, "w1", dag_ids=["report"], schedule=True)
        )
        assert blocked_or_done(db, thread) == "blocked"
        holder.commit()
    thread.join(60)
    assert not thread.is_alive() and outcome.error is None
    (claim,) = outcome.value
    assert (claim.run_id, claim.attempt) == (made.run_id, 1)
    assert claim.event_ids == tuple(e.id for e in events)
    assert db.scalar("SELECT count(*) FROM {ns}.dag_run") == 1
    assert db.scalar("SELECT count(*) FROM {ns}.dagrun_asset_event") == 1


def test_the_run_of_the_pass_it_waited_for_is_claimed_before_the_newer_one(
    db: TestDatabase,
) -> None:
    """The same race with an event that arrives while the claim waits: the claim's pass then
    makes a run too, and the older run, the other pass's, is the one claimed; the newer one
    waits queued for the next claim (oldest first, as every claim). On PostgreSQL the claim
    decides whether to take its pass's run after the wait, so it sees the older run."""
    declare(db, "report", "orders")
    register(db, "orders")
    with db.engine.connect() as holder:
        (made,) = _open_pass(db, holder)
        thread, outcome = in_thread(
            lambda: assetq.claim_runs(db.engine, "w1", dag_ids=["report"], schedule=True)
        )
        assert blocked_or_done(db, thread) == "blocked"
        register(db, "orders")
        holder.commit()
    thread.join(60)
    assert not thread.is_alive() and outcome.error is None
    (claim,) = outcome.value
    assert (claim.run_id, claim.seq, claim.attempt) == (made.run_id, 1, 1)
    states = db.rows("SELECT seq, state, worker FROM {ns}.dag_run ORDER BY seq")
    assert [tuple(r) for r in states] == [(1, "running", "w1"), (2, "queued", None)]


def test_a_pass_held_past_the_wait_is_left_and_the_claim_returns(db: TestDatabase) -> None:
    """A consumer held longer than the wait (0.25 s; on MySQL whole seconds, 1) is skipped as
    a scheduler's pass skips it: the claim returns empty, without an error, while the other
    transaction is still open; its run is claimed by the next claim after it commits."""
    declare(db, "report", "orders")
    register(db, "orders")
    with db.engine.connect() as holder:
        (made,) = _open_pass(db, holder)
        thread, outcome = in_thread(
            lambda: assetq.claim_runs(db.engine, "w1", dag_ids=["report"], schedule=True)
        )
        thread.join(60)
        assert not thread.is_alive()
        assert outcome.error is None and outcome.value == []
        assert holder.in_transaction()
        holder.commit()
    (claim,) = assetq.claim_runs(db.engine, "w1", dag_ids=["report"])
    assert claim.run_id == made.run_id


def test_a_claim_is_fenced_by_its_time_as_well_as_its_attempt(db: TestDatabase) -> None:
    """A run made again with the same run id and attempt (what a claim lost in a crash or a
    failover leaves: the next pass makes the run again) is not the lost claim's: its
    heartbeat and its completion are refused, the new claim's are taken. Made here by
    putting the claimed run back in the queue as it was before its claim, by hand."""
    declare(db, "report", "orders")
    register(db, "orders")
    (lost,) = assetq.claim_runs(db.engine, "w1", dag_ids=["report"], schedule=True)
    db.execute(
        "UPDATE {ns}.dag_run SET state = 'queued', attempt = 0, worker = NULL,"
        " lease_until = NULL, started_at = NULL, deadline = NULL, not_before = created_at"
        " WHERE id = :id",
        id=lost.id,
    )
    (held,) = assetq.claim_runs(db.engine, "w2", dag_ids=["report"])
    assert (held.run_id, held.attempt) == (lost.run_id, lost.attempt)
    assert held.started_at != lost.started_at
    with pytest.raises(assetq.LeaseLost, match="another claim"):
        assetq.heartbeat(db.engine, lost)
    with pytest.raises(assetq.LeaseLost, match="another claim"), db.engine.begin() as conn:
        assetq.complete_run(conn, lost, "success")
    assetq.heartbeat(db.engine, held)
    with db.engine.begin() as conn:
        info = assetq.complete_run(conn, held, "success")
    assert (info.state, info.worker) == ("success", "w2")


@pytest.mark.engines("postgresql")
def test_runs_it_claims_wake_no_worker_and_runs_it_leaves_do(db: TestDatabase) -> None:
    declare(db, "a", "orders")
    declare(db, "b", "orders")
    with _listener(db) as listener:
        register(db, "orders")  # the scheduler's wake-up is not armed: no notification
        (claim,) = assetq.claim_runs(db.engine, "w1", dag_ids=["a"], schedule=True)
        assert _payloads(listener, timeout=0.5) == []
        # Two runs made, one claimed: the other is announced.
        register(db, "orders")
        claims = assetq.claim_runs(db.engine, "w1", dag_ids=["a", "b"], schedule=True)
        assert len(claims) == 1
        assert _payloads(listener, timeout=10) == ["runs"]
    assert claim.dag_id == "a"


@pytest.mark.engines("postgresql")
def test_a_run_the_pass_claimed_and_the_claim_queued_again_is_announced(db: TestDatabase) -> None:
    """A timeout shorter than the pass: the run it made claimed is past its deadline when
    the claim that follows (room for a second run) looks, and is ended as timed out, queued
    again for its retry. Queued by this statement, it is announced ('runs') as every run
    the pass left queued is, so that a worker claims it when its retry is due."""
    declare(db, "a", "orders", max_attempts=3, retry_delay=timedelta(seconds=30))
    register(db, "orders")
    with _listener(db) as listener:
        with db.engine.begin() as conn:
            rows = conn.execute(
                sa.text(
                    db.sql(
                        "SELECT * FROM {ns}.schedule_and_claim('w1', 2, 60, '[\"a\"]', 0.000001, 0)"
                    )
                )
            ).all()
        assert [r.made for r in rows] == [True]
        (run,) = db.rows("SELECT state, attempt, error FROM {ns}.dag_run")
        assert (run.state, run.attempt) == ("queued", 1)
        assert run.error.startswith("timed out after")
        assert _payloads(listener, timeout=10) == ["runs"]


@contextlib.contextmanager
def _listener(db: TestDatabase) -> Iterator[psycopg.Connection[Any]]:
    """A connection of its own that LISTENs on the namespace's channel, as a worker's does."""
    url = db.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute(f"LISTEN {db.namespace}")
        yield listener


def _payloads(listener: psycopg.Connection[Any], timeout: float) -> list[str]:
    """The payloads ``listener`` receives within ``timeout`` seconds (the first one ends the
    wait)."""
    return [n.payload for n in listener.notifies(timeout=timeout, stop_after=1)]


@contextlib.contextmanager
def _wakeup_armed(db: TestDatabase) -> Iterator[None]:
    """A session holding the wake-up lock as a waiting scheduler does: producers notify
    'queued'. No scheduler runs: only a worker can make the runs."""
    with db.engine.connect() as conn:
        conn.execute(sa.text(db.dialect.query("wakeup_arm", db.namespace)))
        conn.commit()
        try:
            yield
        finally:
            conn.execute(sa.text(db.dialect.query("wakeup_disarm", db.namespace)))
            conn.commit()


def _done(db: TestDatabase, dag_id: str) -> int:
    return int(
        db.scalar(
            "SELECT count(*) FROM {ns}.dag_run WHERE dag_id = :d AND state = 'success'", d=dag_id
        )
    )


@pytest.mark.engines("postgresql")
def test_a_worker_woken_by_a_producer_makes_and_claims_the_run_itself(db: TestDatabase) -> None:
    """No scheduler at all, the worker's poll 120 s away: each event's run is made and run by
    the worker as soon as its producer commits."""
    declare(db, "report", "orders")
    stop = threading.Event()
    seen: list[tuple[int, ...]] = []

    def handler(claim: assetq.Claim, conn: sa.Connection) -> None:
        seen.append(claim.event_ids)

    with _wakeup_armed(db):
        thread = threading.Thread(
            target=assetq.run_worker,
            args=(db.engine, {"report": handler}),
            kwargs={"stop": stop, "poll_interval": 120, "namespace": db.namespace},
            daemon=True,
        )
        thread.start()
        try:
            wait_for("the worker to listen", lambda: _listening(db) or None)
            expected = []
            for n in range(3):
                (event,) = register(db, "orders")
                expected.append((event.id,))
                wait_for(f"run {n + 1}", lambda n=n: _done(db, "report") > n or None, deadline=60)
        finally:
            stop.set()
            thread.join(30)
    assert seen == expected
    assert _queue(db) == []


@pytest.mark.engines("postgresql")
def test_the_asyncio_worker_woken_by_a_producer_makes_and_claims_the_run(db: TestDatabase) -> None:
    declare(db, "report", "orders")
    seen: list[tuple[int, ...]] = []

    async def handler(claim: assetq.Claim, conn: Any) -> None:
        seen.append(claim.event_ids)

    async def main() -> list[tuple[int, ...]]:
        engine = create_async_engine(aio.async_url(db.url), poolclass=sa.NullPool)
        stop = asyncio.Event()
        task = asyncio.create_task(
            aio.run_worker(
                engine, {"report": handler}, stop=stop, poll_interval=120, namespace=db.namespace
            )
        )
        expected = []
        try:
            await _until(lambda: _listening(db))
            for n in range(3):
                (event,) = await asyncio.to_thread(register, db, "orders")
                expected.append((event.id,))
                await _until(lambda n=n: _done(db, "report") > n)
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
            await engine.dispose()
        return expected

    with _wakeup_armed(db):
        expected = asyncio.run(main())
    assert seen == expected


async def _until(check: Any, deadline: float = 60) -> None:
    end = time.monotonic() + deadline
    while not await asyncio.to_thread(check):
        if time.monotonic() > end:
            raise AssertionError("gave up waiting")
        await asyncio.sleep(0.02)


def _listening(db: TestDatabase) -> bool:
    """A session of this database other than the test's LISTENs (the worker's listener)."""
    return bool(
        db.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND query LIKE 'LISTEN%'"
        )
    )


# -- the commit that does not wait for the disk (PostgreSQL) -----------------------------------


def _background(engine: sa.Engine, kinds: tuple[str, ...]) -> list[int]:
    with engine.connect() as conn:
        return [
            int(r[0])
            for r in conn.execute(
                sa.text("SELECT pid FROM pg_stat_activity WHERE backend_type = ANY (:k)"),
                {"k": list(kinds)},
            )
        ]


def _lsns(engine: sa.Engine) -> tuple[int, int]:
    """(written and flushed, inserted) WAL positions, in bytes."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT pg_current_wal_flush_lsn() - '0/0', pg_current_wal_insert_lsn() - '0/0'"
            )
        ).one()
    return int(row[0]), int(row[1])


@pytest.mark.engines("postgresql")
def test_a_claim_with_a_pass_is_lost_whole_in_a_crash_and_kept_by_a_durable_commit_after(
    db: TestDatabase,
) -> None:
    """With every process that writes WAL out stopped (SIGSTOP: the WAL writer, the
    background writer, the checkpointer), the claim's commit returns with its WAL not yet
    flushed; an immediate shutdown then loses it whole: the run it made and its claim are
    gone, its events queued again, and the next pass makes their run once. A second claim,
    followed by the attempt's durable completion before the shutdown, survives: the
    completion's flush took the claim's WAL with it."""
    with lone_postgres("autovacuum = off") as node:
        engine = sa.create_engine(node.url(), poolclass=sa.NullPool)
        try:
            assetq.install(engine)
            with engine.begin() as conn:
                assetq.declare_dag(conn, "report", "orders")
                first = assetq.register_event(conn, "orders")
            stopped = _background(engine, ("walwriter", "background writer", "checkpointer"))
            assert len(stopped) == 3
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
            try:
                (claim,) = assetq.claim_runs(engine, "w1", dag_ids=["report"], schedule=True)
                flushed, inserted = _lsns(engine)
                assert flushed < inserted  # committed, not yet on disk
                # The crash comes while they are still stopped: a WAL writer let go first
                # may flush the claim before an immediate shutdown reaches it (it did, once,
                # on a loaded machine).
                node.crash()
            finally:
                for pid in stopped:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
            # A postmaster killed here may stay a zombie (no init reaps it in a container),
            # which its lock files would name as alive: they go with the crash.
            (node.datadir / "postmaster.pid").unlink(missing_ok=True)
            (node.datadir.parent / f".s.PGSQL.{node.port}.lock").unlink(missing_ok=True)
            try:
                node.start()
            except subprocess.CalledProcessError:
                print(node.log.read_text()[-2000:])
                raise
            with engine.connect() as conn:
                runs = conn.execute(sa.text("SELECT count(*) FROM assetq.dag_run")).scalar()
                queued = (
                    conn.execute(sa.text("SELECT asset_event_id FROM assetq.asset_dag_run_queue"))
                    .scalars()
                    .all()
                )
            assert (runs, queued) == (0, [first.id])
            # The holder's completion is refused: the run it held is gone.
            with pytest.raises(assetq.LeaseLost, match="no longer exists"), engine.begin() as conn:
                assetq.complete_run(conn, claim, "success")
            (again,) = assetq.claim_runs(engine, "w2", dag_ids=["report"], schedule=True)
            assert again.event_ids == (first.id,)
            # Made again with the same run id and attempt: the lost claim still does not hold
            # it (its claim time fences it), the new one does.
            assert (again.run_id, again.attempt) == (claim.run_id, claim.attempt)
            with pytest.raises(assetq.LeaseLost, match="another claim"):
                assetq.heartbeat(engine, claim)
            assetq.heartbeat(engine, again)

            # Kept: a durable commit after the claim flushes it.
            with engine.begin() as conn:
                second = assetq.register_event(conn, "orders")
            (claim2,) = assetq.claim_runs(engine, "w3", dag_ids=["report"], schedule=True)
            with engine.begin() as conn:
                assetq.complete_run(conn, claim2, "success")
            node.pg_ctl("stop", "-m", "immediate", "-w", "-t", "60")
            node.start()
            with engine.connect() as conn:
                states = conn.execute(
                    sa.text(
                        "SELECT r.state, l.asset_event_id FROM assetq.dag_run r"
                        " JOIN assetq.dagrun_asset_event l ON l.dag_run_id = r.id"
                        " ORDER BY r.id"
                    )
                ).all()
            assert [tuple(s) for s in states] == [("running", first.id), ("success", second.id)]
        finally:
            engine.dispose()


@pytest.mark.engines("postgresql")
@pytest.mark.parametrize("shell", ["sync", "asyncio"])
def test_a_worker_whose_claim_with_a_pass_is_refused_claims_without_one(
    db: TestDatabase, shell: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Its role cannot run schedule_and_claim (here the routine is gone, as against a schema
    whose routines are older than the package): the first producer's notification makes the
    claim with a pass fail; the worker says so once, and from then on claims without a pass,
    so the runs a scheduler's pass makes are still run, and no claim fails again."""
    declare(db, "report", "orders")
    db.execute("DROP FUNCTION {ns}.schedule_and_claim")
    caplog.set_level(logging.WARNING, logger="assetq")
    seen: list[tuple[int, ...]] = []
    stop = threading.Event()
    if shell == "sync":

        def handler(claim: assetq.Claim, conn: sa.Connection) -> None:
            seen.append(claim.event_ids)

        target: Any = lambda: assetq.run_worker(  # noqa: E731
            db.engine, {"report": handler}, stop=stop, poll_interval=120, namespace=db.namespace
        )
    else:

        async def ahandler(claim: assetq.Claim, conn: Any) -> None:
            seen.append(claim.event_ids)

        async def main() -> Any:
            engine = create_async_engine(aio.async_url(db.url), poolclass=sa.NullPool)
            done = asyncio.Event()
            task = asyncio.create_task(
                aio.run_worker(
                    engine,
                    {"report": ahandler},
                    stop=done,
                    poll_interval=120,
                    namespace=db.namespace,
                )
            )
            await asyncio.to_thread(stop.wait)
            done.set()
            stats = await asyncio.wait_for(task, 30)
            await engine.dispose()
            return stats

        target = lambda: asyncio.run(main())  # noqa: E731
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(target()), daemon=True)
    try:
        with _wakeup_armed(db):
            thread.start()
            wait_for("the worker to listen", lambda: _listening(db) or None)
            expected = []
            for n in range(2):
                (event,) = register(db, "orders")
                expected.append((event.id,))
                assetq.schedule(db.engine)  # the scheduler's pass: 'runs' wakes the worker
                wait_for(f"run {n + 1}", lambda n=n: _done(db, "report") > n or None, deadline=60)
    finally:
        stop.set()
        thread.join(30)
        assetq.repair(db.engine, namespace=db.namespace)
    assert seen == expected
    refused = [
        r for r in caplog.records if "a claim with a pass of its own failed" in r.getMessage()
    ]
    assert len(refused) == 1
    (stats,) = result
    assert stats.errors == 1  # the one refused claim
