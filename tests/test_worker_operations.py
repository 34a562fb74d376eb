"""The worker loops let go of an attempt at its deadline or when its run is cancelled (issue
26, items 1 and 2), on both engines: the handler is told (``claim.cancelled``), a timeout is
recorded as the attempt's failure, and the slot carries on at once, even while the handler's
thread never returns; whatever that thread does later is fenced.

A timeout here is real time (half a second): the test waits for outcomes with deadlines,
never for a duration, and no assertion depends on how long anything took.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool
from test_worker_loop import Worker

import assetq
import assetq.aio
from dbs import TestDatabase
from work_scenario import (
    create_effect_table,
    declare,
    effects,
    expire_lease,
    one_run,
    register,
    run_row,
    seconds_between,
    wait_for,
    wait_past,
    write_effect,
)


def _slow_and_fast(db: TestDatabase, **slow_options: Any) -> tuple[assetq.Run, assetq.Run]:
    """A run of "slow" (on asset a), then one of "fast" (on b): the older is claimed first."""
    slow = one_run(db, "slow", "a", **slow_options)
    declare(db, "fast", "b")
    register(db, "b")
    (fast,) = assetq.schedule(db.engine)
    return slow, fast


@pytest.mark.parametrize("where", ["consumer", "worker"])
def test_a_handler_that_never_returns_is_timed_out_and_its_slot_goes_on(
    db: TestDatabase, where: str
) -> None:
    """One slot. The slow handler blocks until the test lets it go; at its deadline (the
    consumer's timeout, or the worker's default) the attempt is recorded as failed and the
    same slot runs the fast consumer's run meanwhile. Released afterwards, the slow handler's
    write is rolled back: its attempt was let go."""
    create_effect_table(db)
    slow, fast = _slow_and_fast(db, **({"timeout": 0.5} if where == "consumer" else {}))
    release = threading.Event()
    returned = threading.Event()
    seen: list[assetq.Claim] = []
    outcomes: list[tuple[str, str, str | None]] = []

    def slow_handler(claim: assetq.Claim, conn: sa.Connection) -> None:
        seen.append(claim)
        release.wait(60)
        write_effect(conn, claim)
        returned.set()

    def fast_handler(claim: assetq.Claim, conn: sa.Connection) -> None:
        write_effect(conn, claim)

    options = {"timeout": 0.5} if where == "worker" else {}
    stats = Worker(
        db.engine,
        {"slow": slow_handler, "fast": fast_handler},
        max_runs=2,
        poll_interval=0.1,
        on_complete=lambda claim, info, outcome: outcomes.append(
            (claim.dag_id, outcome, info.error if info else None)
        ),
        **options,
    ).join()
    try:
        assert (stats.timed_out, stats.failed, stats.succeeded) == (1, 1, 1)
        assert sorted(outcomes) == [
            ("fast", "success", None),
            ("slow", "failed", "timed out after 0.5s"),
        ]
        assert seen[0].cancelled.is_set() and not returned.is_set()
        row = run_row(db, "slow", slow.run_id)
        assert (row["state"], row["attempt"], row["error"]) == ("failed", 1, "timed out after 0.5s")
        assert run_row(db, "fast", fast.run_id)["state"] == "success"
    finally:
        release.set()
    wait_for("the slow handler to return", returned.is_set)
    wait_for("its thread to end", lambda: not _threads_named_for(seen[0]))
    assert [e[0] for e in effects(db)] == ["fast"]
    assert run_row(db, "slow", slow.run_id) == row


def test_a_worker_whose_only_slot_is_replaced_never_returns_early(
    db: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced: the thread that replaces a slot whose handler timed out is slow to start (2 s),
    while the main thread, which returns once no slot's thread is alive, checks its slots
    every STOP_CHECK. It must never take the replacement for a finished slot: it must not
    reach its clean-up (where it joins the heartbeat's thread) before the replacement
    runs, and the worker goes on to its second run (CI saw it return after the first,
    "stopped after 1 claims")."""
    create_effect_table(db)
    _slow_and_fast(db, timeout=0.5)
    release = threading.Event()
    cleaning_up = threading.Event()
    early: list[bool] = []
    original_start, original_join = threading.Thread.start, threading.Thread.join
    slot_starts = 0

    def start(self: threading.Thread) -> None:
        nonlocal slot_starts
        if self.name == "assetq-worker-1":  # the slot's (not the heartbeat's, the listener's)
            slot_starts += 1
            if slot_starts == 2:  # the replacement, started from the heartbeat's thread
                early.append(cleaning_up.wait(2))
        original_start(self)

    def join(self: threading.Thread, timeout: float | None = None) -> None:
        if self.name == "assetq-worker-heartbeat":
            cleaning_up.set()
        original_join(self, timeout)

    monkeypatch.setattr(threading.Thread, "start", start)
    monkeypatch.setattr(threading.Thread, "join", join)

    def slow_handler(claim: assetq.Claim, conn: sa.Connection) -> None:
        release.wait(60)

    def fast_handler(claim: assetq.Claim, conn: sa.Connection) -> None:
        write_effect(conn, claim)

    try:
        stats = Worker(
            db.engine,
            {"slow": slow_handler, "fast": fast_handler},
            max_runs=2,
            poll_interval=0.1,
        ).join()
    finally:
        release.set()
    assert early == [False]
    assert (stats.claimed, stats.timed_out, stats.succeeded) == (2, 1, 1)
    assert [e[0] for e in effects(db)] == ["fast"]


def _threads_named_for(claim: assetq.Claim) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("assetq-worker-")]


def test_a_run_cancelled_while_its_handler_runs_is_let_go_and_stays_cancelled(
    db: TestDatabase,
) -> None:
    """The next heartbeat finds the run cancelled: claim.cancelled is set, the handler stops
    early (it raises), and nothing is recorded over the cancellation."""
    create_effect_table(db)
    run = one_run(db, max_attempts=3)
    started = threading.Event()
    saw_cancel: list[bool] = []
    outcomes: list[tuple[int, str]] = []

    def handler(claim: assetq.Claim, conn: sa.Connection) -> None:
        write_effect(conn, claim)
        started.set()
        saw_cancel.append(claim.cancelled.wait(30))
        raise RuntimeError("stopped early")

    worker = Worker(
        db.engine,
        {"report": handler},
        max_runs=1,
        lease=3,
        heartbeat_interval=0.2,
        poll_interval=0.1,
        on_complete=lambda claim, info, outcome: outcomes.append((claim.attempt, outcome)),
    )
    wait_for("the handler to start", started.is_set)
    with db.engine.begin() as conn:
        assetq.cancel_run(conn, "report", run.run_id, reason="operator")
    stats = worker.join()
    wait_for("the handler to see the cancellation", lambda: saw_cancel)
    assert saw_cancel == [True]
    assert outcomes == [(1, "lost")]
    assert (stats.abandoned, stats.failed, stats.succeeded) == (1, 0, 0)
    row = run_row(db, "report", run.run_id)
    assert (row["state"], row["error"]) == ("cancelled", "cancelled: operator")
    assert effects(db) == []


def test_the_asyncio_worker_cancels_a_handler_at_its_deadline(db: TestDatabase) -> None:
    """The async handler is cancelled (CancelledError at its await), the attempt recorded as
    timed out, and the slot runs the next run."""
    create_effect_table(db)
    slow, fast = _slow_and_fast(db, timeout=0.5)
    cancelled: list[bool] = []

    async def slow_handler(claim: assetq.Claim, conn: Any) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(claim.cancelled.is_set())
            raise

    async def fast_handler(claim: assetq.Claim, conn: Any) -> None:
        return None

    async def main() -> assetq.WorkerStats:
        engine = create_async_engine(assetq.aio.async_url(db.url), poolclass=NullPool)
        try:
            return await asyncio.wait_for(
                assetq.aio.run_worker(
                    engine,
                    {"slow": slow_handler, "fast": fast_handler},
                    max_runs=2,
                    poll_interval=0.1,
                ),
                60,
            )
        finally:
            await engine.dispose()

    stats = asyncio.run(main())
    assert cancelled == [True]
    assert (stats.timed_out, stats.failed, stats.succeeded) == (1, 1, 1)
    row = run_row(db, "slow", slow.run_id)
    assert (row["state"], row["error"]) == ("failed", "timed out after 0.5s")
    assert run_row(db, "fast", fast.run_id)["state"] == "success"


def test_a_finished_run_wakes_the_scheduler_for_the_capped_consumers_next_run(
    db: TestDatabase,
) -> None:
    """max_active_runs=1, one event per run, a backlog of 6: every run after the first is
    created by a pass the previous run's end started, not by the poll, which is 120 s away:
    the worker's deadline (60 s) is below one poll, and on the database's clock each next run
    is created within seconds of the previous run's end. (PostgreSQL: the end wakes a waiting
    scheduler with 'ended'; a scheduler that is taking the wake-up lock at that moment waits
    for the ending transaction, which holds it shared, and passes once more when it commits.
    MySQL, which has no notifications: the worker runs the pass itself.)"""
    declare(db, "capped", "orders", max_active_runs=1, max_events_per_run=1)
    register(db, *["orders"] * 6)
    stop = threading.Event()
    stats: list[assetq.SchedulerStats] = []
    scheduler = threading.Thread(
        target=lambda: stats.append(
            assetq.run_scheduler(db.engine, poll_interval=120, stop_event=stop)
        ),
        daemon=True,
    )
    scheduler.start()
    try:
        Worker(db.engine, {"capped": lambda claim, conn: None}, max_runs=6, poll_interval=0.1).join(
            deadline=60
        )
    finally:
        stop.set()
        scheduler.join(30)
    (done,) = stats
    rows = db.rows(
        "SELECT seq, created_at, ended_at FROM {ns}.dag_run WHERE dag_id = 'capped' ORDER BY seq"
    )
    assert [r.seq for r in rows] == [1, 2, 3, 4, 5, 6]
    gaps = [seconds_between(b.created_at, a.ended_at) for a, b in itertools.pairwise(rows)]
    assert all(0 <= gap < 30 for gap in gaps), (gaps, done)


@pytest.mark.engines("postgresql")
def test_a_dead_holders_run_failed_by_a_claim_wakes_the_scheduler_for_the_next_run(
    db: TestDatabase,
) -> None:
    """The capped consumer's run is held by a worker that dies on its last attempt. The claim
    that fails it (its lease expired) frees the consumer's place and wakes the waiting
    scheduler, whose pass makes the next run: the poll is 120 s away, the test's deadline 60."""
    declare(db, "capped", "orders", max_active_runs=1, max_events_per_run=1)
    stop = threading.Event()
    scheduler = threading.Thread(
        target=assetq.run_scheduler,
        kwargs={"engine": db.engine, "poll_interval": 120, "stop_event": stop},
        daemon=True,
    )
    scheduler.start()
    try:
        register(db, "orders", "orders")  # the waiting scheduler is notified: the first run
        (dead,) = wait_for(
            "the first run", lambda: assetq.claim_runs(db.engine, "dead", lease=0.2) or None
        )
        assert dead.lease_until is not None
        wait_past(db, dead.lease_until)
        assert assetq.claim_runs(db.engine, "next") == []  # fails the dead run: last attempt
        assert run_row(db, "capped", dead.run_id)["state"] == "failed"
        (second,) = wait_for(
            "the next run", lambda: assetq.claim_runs(db.engine, "next") or None, deadline=60
        )
        assert second.run_id != dead.run_id
    finally:
        stop.set()
        scheduler.join(30)


def test_a_worker_that_claims_again_a_run_it_still_runs_keeps_both_attempts_apart(
    db: TestDatabase,
) -> None:
    """The chaos soak's find: a worker whose attempt 1 of a run is still in its handler (a
    stopped worker, resumed) claims the same run again as attempt 2 once the lease expired.
    The two attempts are held apart (by run, attempt and claim time): attempt 1's end, refused
    (LeaseLost), does not take attempt 2's place with it, and attempt 2 completes; keyed by
    run alone, attempt 2's completion raised KeyError and the worker exited. Forced: attempt
    1's handler waits for the test, its lease is expired in the row, the worker's other slot
    claims the run again, then attempt 1 returns before attempt 2."""
    run = one_run(db, max_attempts=3)
    started = {1: threading.Event(), 2: threading.Event()}
    release = {1: threading.Event(), 2: threading.Event()}
    outcomes: list[tuple[int, str]] = []
    ended = threading.Event()

    def handler(claim: assetq.Claim, conn: sa.Connection) -> None:
        started[claim.attempt].set()
        assert release[claim.attempt].wait(60)

    def on_complete(claim: assetq.Claim, info: Any, outcome: str) -> None:
        outcomes.append((claim.attempt, outcome))
        ended.set()

    worker = Worker(
        db.engine,
        {run.dag_id: handler},
        worker="w",
        concurrency=2,
        lease=60,
        poll_interval=0.05,
        on_complete=on_complete,
    )
    try:
        assert started[1].wait(30)
        expire_lease(db, run.id)
        assert started[2].wait(30), "the worker's other slot did not claim the run again"
        release[1].set()
        wait_for("attempt 1 refused", lambda: (1, "lost") in outcomes)
        release[2].set()
        wait_for("attempt 2 completed", lambda: (2, "success") in outcomes)
    finally:
        for event in release.values():
            event.set()
        worker.stop.set()
    stats = worker.join()  # raises what the worker raised
    assert (stats.succeeded, stats.lost) == (1, 1)
    assert run_row(db, run.dag_id, run.run_id)["state"] == "success"
