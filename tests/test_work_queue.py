"""Runs as a work queue (issue 12): claim, lease, heartbeat, fenced completion, retries, and
a run's outputs committed with its success (I8, I9, I10), on both engines.

Concurrency claims are forced, not hoped for: racing claimers are released together by a
barrier, each on its own connection; a lock held by an open transaction is held for real
while the other claimer runs (with a deadline, so a claimer that waits fails the test); a
stale attempt is made stale by letting its lease expire on the database's clock (polled,
never slept) and claiming the run again. "Nothing written" is checked against every assetq
table, the run's row as stored (updated_at included) and the user's own table.
"""

from __future__ import annotations

import json
import math
import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
from dbs import TestDatabase
from work_scenario import (
    Statements,
    claim_until,
    create_effect_table,
    db_now,
    declare,
    effects,
    events_from,
    join_all,
    make_runs,
    next_run,
    one_run,
    register,
    run_events,
    run_row,
    seconds_between,
    tuples,
    wait_past,
    write_effect,
)

OUTPUT = "sales_report"
#: A lease meant to expire, seconds: the wait for it is a poll of the database's clock.
SHORT_LEASE = 0.3


def _stale_and_current(db: TestDatabase, **options: Any) -> tuple[assetq.Claim, assetq.Claim]:
    """A run claimed by "zombie" under a short lease, which expired (database clock), and
    claimed again by "successor": (the stale claim, the current one). Two attempts: an
    expired lease on the last one fails the run instead."""
    one_run(db, **{"max_attempts": 2, **options})
    (stale,) = assetq.claim_runs(db.engine, "zombie", lease=SHORT_LEASE)
    assert stale.lease_until is not None
    wait_past(db, stale.lease_until)
    (current,) = claim_until(db, "successor", lease=60)
    assert (current.id, current.attempt) == (stale.id, 2)
    return stale, current


def _declare_output(db: TestDatabase) -> None:
    """The asset runs produce, when no consumer names it."""
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, OUTPUT)


# -- claims ---------------------------------------------------------------------------------


def _race(engine: sa.Engine, workers: int, *, lease: float) -> list[assetq.Claim]:
    """``workers`` threads, each on its own connection, released together, claim 3 runs at a
    time until a claim comes back empty; every claim they got."""
    barrier = threading.Barrier(workers)
    got: list[list[assetq.Claim]] = [[] for _ in range(workers)]
    failures: list[BaseException] = []

    def claimer(n: int) -> None:
        try:
            barrier.wait(timeout=30)
            while claims := assetq.claim_runs(engine, f"racer_{n}", limit=3, lease=lease):
                got[n].extend(claims)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(workers)]
    for thread in threads:
        thread.start()
    join_all(threads, deadline=60)
    assert failures == []
    return [claim for claims in got for claim in claims]


def test_racing_workers_claim_every_run_exactly_once(db: TestDatabase) -> None:
    runs = make_runs(db, 40)
    engine = db.new_engine(pool_size=8, max_overflow=0)
    claims = _race(engine, 8, lease=60)
    # A claimer that found only rows other claimers had locked stopped early: sweep.
    claims += assetq.claim_runs(db.engine, "sweeper", limit=100)
    times = Counter(c.id for c in claims)
    assert times == Counter({r.id: 1 for r in runs})
    assert {c.attempt for c in claims} == {1}
    assert {c.id: c.event_ids for c in claims} == {r.id: r.event_ids for r in runs}
    stored = {
        (str(r[0]), int(r[1])): (str(r[2]), str(r[3]), int(r[4]))
        for r in tuples(db, "SELECT dag_id, id, state, worker, attempt FROM {ns}.dag_run")
    }
    assert stored == {(c.dag_id, c.id): ("running", c.worker, 1) for c in claims}


def test_after_their_leases_expire_racing_workers_claim_each_run_once_as_attempt_2(
    db: TestDatabase,
) -> None:
    runs = make_runs(db, 30, max_attempts=2)
    first = assetq.claim_runs(db.engine, "dead_worker", limit=100, lease=SHORT_LEASE)
    assert len(first) == 30
    wait_past(db, max(c.lease_until for c in first if c.lease_until is not None))
    engine = db.new_engine(pool_size=6, max_overflow=0)
    claims = _race(engine, 6, lease=60)
    claims += assetq.claim_runs(db.engine, "sweeper", limit=100)
    assert Counter(c.id for c in claims) == Counter({r.id: 1 for r in runs})
    assert {c.attempt for c in claims} == {2}
    # The same events, the same run: a new attempt, not a new run.
    assert {(c.id, c.run_id, c.event_ids) for c in claims} == {
        (r.id, r.run_id, r.event_ids) for r in runs
    }
    assert {c.id: c.event_ids for c in claims} == {
        c.id: run_events(db, c.dag_id, c.run_id) for c in claims
    }


def _claim_beside(db: TestDatabase, holder: sa.Connection) -> tuple[list[assetq.Claim], bool]:
    """claim_runs(limit=2) by "other" in a thread while ``holder``'s transaction is open:
    (what it claimed, whether it was still waiting after 20 s). A waiting claimer is let go
    by the end of ``holder``'s transaction, so that the test fails instead of hanging."""
    result: list[list[assetq.Claim]] = []
    failures: list[BaseException] = []

    def other_claimer() -> None:
        try:
            result.append(assetq.claim_runs(db.engine, "other", limit=2))
        except BaseException as exc:
            failures.append(exc)

    claimer = threading.Thread(target=other_claimer)
    claimer.start()
    claimer.join(timeout=20)
    waited = claimer.is_alive()
    if waited:
        holder.rollback()
        claimer.join(timeout=30)
    assert failures == []
    return (result[0] if result else []), waited


def test_a_run_locked_by_select_for_update_is_skipped_not_waited_for(db: TestDatabase) -> None:
    older, newer = make_runs(db, 2)
    with db.engine.connect() as holder:
        holder.begin()
        holder.execute(
            sa.text(db.sql("SELECT id FROM {ns}.dag_run WHERE id = :id FOR UPDATE")),
            {"id": older.id},
        )
        claimed, waited = _claim_beside(db, holder)
        holder.rollback()
    assert not waited, "claim_runs waited for the row another transaction locked"
    assert [c.id for c in claimed] == [newer.id]
    # Released: the skipped run is claimable, by the next claimer.
    (late,) = assetq.claim_runs(db.engine, "late", limit=2)
    assert (late.id, late.attempt) == (older.id, 1)


def test_a_run_held_by_an_open_claim_transaction_is_skipped_and_claimed_once(
    db: TestDatabase,
) -> None:
    older, newer = make_runs(db, 2)
    with db.engine.connect() as holder:
        holder.begin()
        # The claim routine itself, its transaction left open.
        db.dialect.execute(holder, "scheduler_transaction", db.namespace)
        (held,) = db.dialect.execute(
            holder,
            "claim_runs",
            db.namespace,
            {
                "worker": "holder",
                "limit": 1,
                "lease_seconds": 60,
                "dag_ids": None,
                "timeout_seconds": None,
            },
        )
        assert int(held.dag_run_id) == older.id
        claimed, waited = _claim_beside(db, holder)
        holder.commit()
    assert not waited, "claim_runs waited for the run an open claim holds"
    assert [c.id for c in claimed] == [newer.id]
    stored = {
        (int(r[0]), str(r[1]), int(r[2]))
        for r in tuples(db, "SELECT id, worker, attempt FROM {ns}.dag_run")
    }
    assert stored == {(older.id, "holder", 1), (newer.id, "other", 1)}


def test_claims_take_the_oldest_claimable_runs_of_the_consumers_named(db: TestDatabase) -> None:
    runs = make_runs(db, 4)
    named = assetq.claim_runs(db.engine, "w1", limit=10, dag_ids=[runs[3].dag_id, "unknown"])
    assert [c.id for c in named] == [runs[3].id]
    taken = [assetq.claim_runs(db.engine, "w2")[0].id for _ in range(3)]
    assert taken == [r.id for r in runs[:3]]  # oldest first, across consumers
    assert assetq.claim_runs(db.engine, "w3") == []


# -- heartbeat and fencing ------------------------------------------------------------------


def test_a_claims_lease_and_its_renewal_are_taken_on_the_database_clock(
    db: TestDatabase,
) -> None:
    run = one_run(db)
    before = db_now(db)
    (claim,) = assetq.claim_runs(db.engine, "w1", lease=timedelta(seconds=30))
    after = db_now(db)
    assert claim.lease_until is not None
    assert before + timedelta(seconds=30) <= claim.lease_until <= after + timedelta(seconds=30)
    assert claim.started_at is not None and before <= claim.started_at <= after
    row = run_row(db, run.dag_id, run.run_id)
    assert (row["state"], row["attempt"], row["worker"]) == ("running", 1, "w1")
    assert row["lease_until"] == claim.lease_until
    # Nobody else gets it while the lease runs.
    assert assetq.claim_runs(db.engine, "w2") == []

    before = db_now(db)
    renewed = assetq.heartbeat(db.engine, claim, lease=timedelta(seconds=45))
    after = db_now(db)
    assert renewed.lease_until is not None
    assert before + timedelta(seconds=45) <= renewed.lease_until <= after + timedelta(seconds=45)
    assert (renewed.id, renewed.attempt, renewed.lease) == (claim.id, 1, timedelta(seconds=45))
    assert run_row(db, run.dag_id, run.run_id)["lease_until"] == renewed.lease_until
    # By default it renews by the lease the claim was taken with.
    assert assetq.heartbeat(db.engine, claim).lease == timedelta(seconds=30)


def test_a_stale_attempts_heartbeat_raises_lease_lost_and_writes_nothing(
    db: TestDatabase,
) -> None:
    stale, current = _stale_and_current(db)
    before = run_row(db, stale.dag_id, stale.run_id)
    counts = db.counts()
    with pytest.raises(assetq.LeaseLost) as raised:
        assetq.heartbeat(db.engine, stale, lease=600)
    assert raised.value.code == "AQ010"
    assert run_row(db, stale.dag_id, stale.run_id) == before
    assert (before["worker"], before["attempt"]) == ("successor", 2)
    assert db.counts() == counts
    # The current holder is not disturbed.
    assert assetq.heartbeat(db.engine, current).attempt == 2


def test_a_zombie_workers_late_completion_is_refused_and_leaves_nothing(db: TestDatabase) -> None:
    """Two runs, both claimed again after their first holder's lease expired: its late
    success (with its own row and an output event) and its late failure are both refused."""
    create_effect_table(db)
    declare(db, "downstream", OUTPUT)
    make_runs(db, 2, max_attempts=2)
    stale = assetq.claim_runs(db.engine, "zombie", limit=2, lease=SHORT_LEASE)
    wait_past(db, max(c.lease_until for c in stale if c.lease_until is not None))
    current = assetq.claim_runs(db.engine, "successor", limit=2)
    assert [(c.id, c.attempt) for c in current] == [(c.id, 2) for c in stale]
    before = [run_row(db, c.dag_id, c.run_id) for c in stale]
    counts = db.counts()
    for claim, state in zip(stale, ("success", "failed"), strict=True):
        with db.engine.connect() as conn:
            conn.begin()
            write_effect(conn, claim)  # the handler's own write, in the completing transaction
            with pytest.raises(assetq.LeaseLost) as raised:
                if state == "success":
                    assetq.complete_run(conn, claim, "success", events=[assetq.NewEvent(OUTPUT)])
                else:
                    assetq.complete_run(conn, claim, "failed", error="too late")
            # PostgreSQL aborted the transaction; on MySQL the caller's row is still in it.
            # Either way the caller rolls back, as LeaseLost says.
            conn.rollback()
        assert raised.value.code == "AQ010", state
    assert effects(db) == []
    assert db.counts() == counts
    assert [run_row(db, c.dag_id, c.run_id) for c in stale] == before
    assert [events_from(db, c.dag_id, c.run_id) for c in stale] == [[], []]
    # The current holders complete them.
    with db.engine.begin() as conn:
        done = [assetq.complete_run(conn, c, "success") for c in current]
    assert [(d.state, d.attempt, d.worker) for d in done] == [("success", 2, "successor")] * 2


def test_a_worker_whose_lease_expired_may_complete_while_nobody_claimed_the_run_again(
    db: TestDatabase,
) -> None:
    create_effect_table(db)
    _declare_output(db)
    run = one_run(db, max_attempts=2)  # claimable again once the lease expired
    (claim,) = assetq.claim_runs(db.engine, "slow", lease=SHORT_LEASE)
    assert claim.lease_until is not None
    wait_past(db, claim.lease_until)
    with db.engine.begin() as conn:
        write_effect(conn, claim)
        done = assetq.complete_run(conn, claim, "success", events=[assetq.NewEvent(OUTPUT)])
    assert (done.state, done.attempt, done.worker) == ("success", 1, "slow")
    assert effects(db) == [(run.dag_id, run.run_id, 1, "slow")]
    assert events_from(db, run.dag_id, run.run_id) == list(done.output_event_ids)
    # Finished: nobody claims it any more.
    assert assetq.claim_runs(db.engine, "late") == []


@pytest.mark.parametrize("then", ["commit", "rollback"])
def test_a_completion_not_yet_committed_keeps_its_run_past_the_lease_until_it_ends(
    db: TestDatabase, then: str
) -> None:
    """A worker frozen between its completion and its COMMIT (SIGSTOP, a paused VM) holds
    the run's row locked in its open transaction: claims skip the run (SKIP LOCKED) however
    long ago its lease expired, so nobody takes it over; it is the frozen worker's success
    once it goes on and commits, and claimable again as the next attempt once its transaction
    ends without (its session dropped: the server rolls it back). The chaos soak
    (tests/soak.py) stops only workers holding runs that are not locked so."""
    create_effect_table(db)
    run = one_run(db, max_attempts=2)
    (claim,) = assetq.claim_runs(db.engine, "frozen", lease=SHORT_LEASE)
    assert claim.lease_until is not None
    with db.engine.connect() as conn:
        transaction = conn.begin()
        write_effect(conn, claim)
        assetq.complete_run(conn, claim, "success")  # sent, not committed
        wait_past(db, claim.lease_until)
        assert assetq.claim_runs(db.engine, "other") == []
        assert run_row(db, run.dag_id, run.run_id)["state"] == "running"
        if then == "commit":
            transaction.commit()
        else:
            transaction.rollback()
    if then == "commit":
        assert (run_row(db, run.dag_id, run.run_id)["state"], effects(db)) == (
            "success",
            [(run.dag_id, run.run_id, 1, "frozen")],
        )
        assert assetq.claim_runs(db.engine, "other") == []
    else:
        (again,) = claim_until(db, "other", lease=60)
        assert (again.run_id, again.attempt, effects(db)) == (run.run_id, 2, [])


def test_a_heartbeat_after_the_lease_expired_renews_it_while_nobody_claimed_the_run_again(
    db: TestDatabase,
) -> None:
    run = one_run(db, max_attempts=2)  # claimable again once the lease expired
    (claim,) = assetq.claim_runs(db.engine, "slow", lease=SHORT_LEASE)
    assert claim.lease_until is not None
    expired_at = wait_past(db, claim.lease_until)
    renewed = assetq.heartbeat(db.engine, claim, lease=60)
    assert renewed.lease_until is not None and renewed.lease_until > expired_at
    assert run_row(db, run.dag_id, run.run_id)["lease_until"] == renewed.lease_until
    assert assetq.claim_runs(db.engine, "other") == []


def test_completing_or_renewing_a_finished_attempt_is_refused(db: TestDatabase) -> None:
    declare(db, "downstream", OUTPUT)
    run = one_run(db)
    (claim,) = assetq.claim_runs(db.engine, "w1")
    with db.engine.begin() as conn:
        assetq.complete_run(conn, claim, "success", events=[assetq.NewEvent(OUTPUT)])
    counts = db.counts()
    before = run_row(db, run.dag_id, run.run_id)
    with db.engine.connect() as conn, pytest.raises(assetq.LeaseLost), conn.begin():
        assetq.complete_run(conn, claim, "success", events=[assetq.NewEvent(OUTPUT)])
    with pytest.raises(assetq.LeaseLost):
        assetq.heartbeat(db.engine, claim)
    assert db.counts() == counts
    assert run_row(db, run.dag_id, run.run_id) == before
    assert len(events_from(db, run.dag_id, run.run_id)) == 1


# -- retries --------------------------------------------------------------------------------


def _fail(db: TestDatabase, claim: assetq.Claim, error: str) -> tuple[assetq.Run, Any, Any]:
    """Complete ``claim`` as failed; (the run, the database clock just before, just after)."""
    before = db_now(db)
    with db.engine.begin() as conn:
        info = assetq.complete_run(conn, claim, "failed", error=error)
    return info, before, db_now(db)


def test_a_failed_attempt_is_recorded_and_queued_again_after_the_retry_delay(
    db: TestDatabase,
) -> None:
    run = one_run(db, max_attempts=3, retry_delay=timedelta(seconds=0.3))
    (claim,) = assetq.claim_runs(db.engine, "w1")
    info, before, after = _fail(db, claim, "boom 1")
    assert (info.state, info.attempt, info.error) == ("queued", 1, "boom 1")
    assert info.not_before is not None
    delay, slack = timedelta(seconds=0.3), timedelta(milliseconds=2)
    assert before + delay - slack <= info.not_before <= after + delay + slack
    assert run_row(db, run.dag_id, run.run_id)["error"] == "boom 1"
    (retry,) = claim_until(db, "w2")
    # Not before its delay: the claim's own clock reading is past not_before.
    assert retry.started_at is not None and retry.started_at >= info.not_before
    assert (retry.id, retry.run_id, retry.attempt) == (run.id, run.run_id, 2)
    assert retry.event_ids == run.event_ids


def test_retry_delays_double_per_failed_attempt_up_to_max_retry_delay(db: TestDatabase) -> None:
    """Delays 0.1, 0.2, then 0.25 (0.4 capped), each measured against the database clock read
    just before and just after the failing completion."""
    run = one_run(db, max_attempts=4, retry_delay=timedelta(seconds=0.1), max_retry_delay=0.25)
    slack = timedelta(milliseconds=2)  # the engines store microseconds
    for attempt, expected in enumerate((0.1, 0.2, 0.25), start=1):
        (claim,) = claim_until(db, f"w{attempt}")
        assert claim.attempt == attempt
        info, before, after = _fail(db, claim, f"failure {attempt}")
        assert info.state == "queued" and info.not_before is not None
        delay = timedelta(seconds=expected)
        assert before + delay - slack <= info.not_before <= after + delay + slack, (
            attempt,
            seconds_between(info.not_before, before),
        )
    (last,) = claim_until(db, "w4")
    assert (last.attempt, last.event_ids) == (4, run.event_ids)


def test_the_last_failed_attempt_is_final_and_frees_the_cap(db: TestDatabase) -> None:
    run = one_run(db, max_attempts=2, max_active_runs=1)
    assert next_run(db, "report") is None  # at its cap: the new event waits
    (first,) = assetq.claim_runs(db.engine, "w1")
    queued, _, _ = _fail(db, first, "first failure")
    assert queued.state == "queued"
    assert assetq.schedule(db.engine) == []  # a retrying run still holds the cap
    (second,) = claim_until(db, "w2")
    assert second.attempt == 2
    final, _, _ = _fail(db, second, "second failure")
    assert (final.state, final.attempt, final.error) == ("failed", 2, "second failure")
    assert final.ended_at is not None and final.not_before is None
    assert assetq.claim_runs(db.engine, "w3") == []
    (following,) = assetq.schedule(db.engine)
    assert (following.dag_id, following.seq) == ("report", run.seq + 1)


def test_retry_run_gives_a_failed_run_its_next_attempt_with_the_same_events_and_run_id(
    db: TestDatabase,
) -> None:
    run = one_run(db, max_attempts=3)
    for attempt in (1, 2, 3):
        (claim,) = claim_until(db, f"w{attempt}")
        info, _, _ = _fail(db, claim, f"failure {attempt}")
    assert (info.state, info.attempt) == ("failed", 3)
    with db.engine.begin() as conn:
        retried = assetq.retry_run(conn, run.dag_id, run.run_id)
    assert (retried.id, retried.run_id, retried.state, retried.attempt) == (
        run.id,
        run.run_id,
        "queued",
        3,
    )
    (again,) = assetq.claim_runs(db.engine, "w4")
    # The count goes on, the events are the run's own.
    assert (again.id, again.run_id, again.attempt, again.event_ids) == (
        run.id,
        run.run_id,
        4,
        run.event_ids,
    )
    assert run_events(db, run.dag_id, run.run_id) == run.event_ids
    # One more attempt, whatever max_attempts says: a failure of it is final again.
    final, _, _ = _fail(db, again, "failure 4")
    assert (final.state, final.attempt) == ("failed", 4)


def test_retry_run_of_a_run_that_is_not_failed_raises_invalid_run_state(db: TestDatabase) -> None:
    queued, running, succeeded = make_runs(db, 3)
    claims = assetq.claim_runs(db.engine, "w1", dag_ids=[running.dag_id, succeeded.dag_id], limit=2)
    with db.engine.begin() as conn:
        assetq.complete_run(conn, claims[1], "success")
    for run, state in ((queued, "queued"), (running, "running"), (succeeded, "success")):
        before = run_row(db, run.dag_id, run.run_id)
        assert before["state"] == state
        with (
            db.engine.connect() as conn,
            pytest.raises(assetq.InvalidRunState) as raised,
            conn.begin(),
        ):
            assetq.retry_run(conn, run.dag_id, run.run_id)
        assert raised.value.code == "AQ008", state
        assert run_row(db, run.dag_id, run.run_id) == before
    with db.engine.connect() as conn, pytest.raises(assetq.UnknownRun), conn.begin():
        assetq.retry_run(conn, queued.dag_id, "no_such_run")


def test_a_run_whose_last_attempts_lease_expired_is_failed_by_the_next_claim(
    db: TestDatabase,
) -> None:
    """The claim's reaper: the expired run is failed (the error says why), and the claim goes
    on to the limit with the next claimable run."""
    declare(db, "other", "invoices")
    run = one_run(db, max_attempts=1)
    (claim,) = assetq.claim_runs(db.engine, "dead", lease=SHORT_LEASE)
    assert claim.lease_until is not None
    wait_past(db, claim.lease_until)
    register(db, "invoices")
    (other,) = assetq.schedule(db.engine)  # claimable after the expired lease: behind it
    (taken,) = assetq.claim_runs(db.engine, "w2", limit=1)
    assert taken.id == other.id
    row = run_row(db, run.dag_id, run.run_id)
    assert (row["state"], row["attempt"], row["worker"]) == ("failed", 1, "dead")
    assert row["not_before"] is None and row["ended_at"] is not None
    assert "lease" in row["error"] and "expired" in row["error"]


# -- outputs with success (I9) --------------------------------------------------------------


def test_a_rolled_back_success_leaves_no_row_no_output_event_and_no_queue_row(
    db: TestDatabase,
) -> None:
    create_effect_table(db)
    declare(db, "downstream", OUTPUT)
    run = one_run(db)
    (claim,) = assetq.claim_runs(db.engine, "w1")
    before = run_row(db, run.dag_id, run.run_id)
    counts = db.counts()
    with db.engine.connect() as conn:
        conn.begin()
        write_effect(conn, claim)
        done = assetq.complete_run(conn, claim, "success", events=[assetq.NewEvent(OUTPUT)])
        assert done.state == "success" and len(done.output_event_ids) == 1
        conn.rollback()  # the handler's transaction fails after the completion
    assert effects(db) == []
    assert db.counts() == counts
    assert run_row(db, run.dag_id, run.run_id) == before
    assert (
        db.scalar(
            "SELECT count(*) FROM {ns}.asset_event WHERE id = :id", id=done.output_event_ids[0]
        )
        == 0
    )
    # Still held: its worker may complete it again.
    with db.engine.begin() as conn:
        assert assetq.complete_run(conn, claim, "success").state == "success"


def test_a_committed_success_commits_the_row_the_run_and_its_output_events_exactly_once(
    db: TestDatabase,
) -> None:
    create_effect_table(db)
    declare(db, "downstream", OUTPUT)
    run = one_run(db)
    (claim,) = assetq.claim_runs(db.engine, "w1")
    counts = db.counts()
    with db.engine.begin() as conn:
        write_effect(conn, claim)
        done = assetq.complete_run(
            conn,
            claim,
            "success",
            events=[assetq.NewEvent(OUTPUT, extra={"rows": 3}), {"asset": OUTPUT}],
        )
    assert effects(db) == [(run.dag_id, run.run_id, 1, "w1")]
    assert (done.state, done.ended_at is not None, done.lease_until) == ("success", True, None)
    assert len(done.output_event_ids) == 2
    assert events_from(db, run.dag_id, run.run_id) == sorted(done.output_event_ids)
    queued = [
        int(r[0])
        for r in db.rows(
            "SELECT asset_event_id FROM {ns}.asset_dag_run_queue WHERE target_dag_id = 'downstream'"
            " ORDER BY 1"
        )
    ]
    assert queued == sorted(done.output_event_ids)
    after = db.counts()
    assert after["asset_event"] == counts["asset_event"] + 2
    assert after["asset_dag_run_queue"] == counts["asset_dag_run_queue"] + 2
    extra = db.scalar(
        "SELECT extra FROM {ns}.asset_event WHERE id = :id", id=done.output_event_ids[0]
    )
    assert (extra if isinstance(extra, dict) else json.loads(extra)) == {"rows": 3}


def test_output_events_have_the_run_as_their_source_unless_they_name_one(
    db: TestDatabase,
) -> None:
    _declare_output(db)
    run = one_run(db)
    (claim,) = assetq.claim_runs(db.engine, "w1")
    with db.engine.begin() as conn:
        done = assetq.complete_run(
            conn,
            claim,
            "success",
            events=[
                assetq.NewEvent(OUTPUT),
                assetq.NewEvent(OUTPUT, source=assetq.Source(dag_id="elsewhere", task_id="t")),
            ],
        )
    sources = {
        int(r[0]): (r[1], r[2], r[3])
        for r in tuples(
            db,
            "SELECT id, source_dag_id, source_run_id, source_task_id FROM {ns}.asset_event"
            " WHERE id IN (:a, :b)",
            a=done.output_event_ids[0],
            b=done.output_event_ids[1],
        )
    }
    assert sources == {
        done.output_event_ids[0]: (run.dag_id, run.run_id, None),
        done.output_event_ids[1]: ("elsewhere", None, "t"),
    }


def test_producer_scheduler_worker_output_event_next_consumer_end_to_end(
    db: TestDatabase,
) -> None:
    create_effect_table(db)
    declare(db, "report", "orders")
    declare(db, "publish", OUTPUT)
    (order,) = register(db, "orders")
    (report,) = assetq.schedule(db.engine)
    assert report.event_ids == (order.id,)
    (claim,) = assetq.claim_runs(db.engine, "w1")
    with db.engine.begin() as conn:
        write_effect(conn, claim)
        done = assetq.complete_run(conn, claim, "success", events=[assetq.NewEvent(OUTPUT)])
    (publish,) = assetq.schedule(db.engine)
    assert (publish.dag_id, publish.event_ids) == ("publish", done.output_event_ids)
    (second,) = assetq.claim_runs(db.engine, "w2")
    assert (second.id, second.event_ids) == (publish.id, done.output_event_ids)
    with db.engine.begin() as conn:
        write_effect(conn, second)
        assetq.complete_run(conn, second, "success")
    assert effects(db) == [
        ("publish", publish.run_id, 1, "w2"),
        ("report", report.run_id, 1, "w1"),
    ]
    assert assetq.schedule(db.engine) == []


def test_a_completion_whose_output_event_is_refused_writes_nothing(db: TestDatabase) -> None:
    _declare_output(db)
    run = one_run(db)
    (claim,) = assetq.claim_runs(db.engine, "w1")
    before = run_row(db, run.dag_id, run.run_id)
    counts = db.counts()
    with db.engine.connect() as conn, pytest.raises(assetq.UnknownAsset), conn.begin():
        assetq.complete_run(
            conn, claim, "success", events=[{"asset": OUTPUT}, {"asset": "no_such_asset"}]
        )
    assert db.counts() == counts
    assert run_row(db, run.dag_id, run.run_id) == before


# -- set_run_state and held runs ------------------------------------------------------------


def test_set_run_state_refuses_to_move_a_run_a_worker_holds(db: TestDatabase) -> None:
    run = one_run(db)
    (claim,) = assetq.claim_runs(db.engine, "w1")
    before = run_row(db, run.dag_id, run.run_id)
    for state in ("success", "failed", "queued"):
        with (
            db.engine.connect() as conn,
            pytest.raises(assetq.InvalidRunState) as raised,
            conn.begin(),
        ):
            assetq.set_run_state(conn, run.dag_id, run.run_id, state)
        assert raised.value.code == "AQ008", state
        assert run_row(db, run.dag_id, run.run_id) == before, state
    with db.engine.begin() as conn:
        assert assetq.complete_run(conn, claim, "success").state == "success"


def test_set_run_state_still_moves_an_unclaimed_run_and_no_worker_claims_it_then(
    db: TestDatabase,
) -> None:
    run = one_run(db)
    with db.engine.begin() as conn:
        moved = assetq.set_run_state(conn, run.dag_id, run.run_id, "running")
    assert (moved.state, moved.worker, moved.not_before) == ("running", None, None)
    assert assetq.claim_runs(db.engine, "w1") == []
    with db.engine.begin() as conn:
        assert assetq.set_run_state(conn, run.dag_id, run.run_id, "success").state == "success"
    assert assetq.claim_runs(db.engine, "w1") == []


def _retrying_run_moved_to_running_by_hand(db: TestDatabase) -> tuple[assetq.Run, assetq.Claim]:
    """A run whose first attempt failed (queued again for its retry), then moved to running
    by hand: (the run, the claim of its finished first attempt)."""
    run = one_run(db, max_attempts=3)
    (first,) = assetq.claim_runs(db.engine, "w1")
    _fail(db, first, "boom")
    with db.engine.begin() as conn:
        moved = assetq.set_run_state(conn, run.dag_id, run.run_id, "running")
    assert (moved.state, moved.not_before) == ("running", None)
    return run, first


def test_a_retrying_run_moved_to_running_by_hand_can_be_finished_by_hand(
    db: TestDatabase,
) -> None:
    """Nobody holds it (no worker claims a run moved by hand, and it has no lease), so the
    hand that moved it must be able to finish it; else it stays running for good, holding
    its consumer's max_active_runs."""
    run, _ = _retrying_run_moved_to_running_by_hand(db)
    assert assetq.claim_runs(db.engine, "w2") == []
    with db.engine.begin() as conn:
        done = assetq.set_run_state(conn, run.dag_id, run.run_id, "success")
    assert done.state == "success"


def test_the_claim_of_a_finished_attempt_cannot_complete_a_run_moved_to_running_by_hand(
    db: TestDatabase,
) -> None:
    """Attempt 1 failed and was recorded; its claim is stale from then on (I8), also once
    the run is running again, by hand."""
    run, first = _retrying_run_moved_to_running_by_hand(db)
    before = run_row(db, run.dag_id, run.run_id)
    with db.engine.connect() as conn, pytest.raises(assetq.LeaseLost), conn.begin():
        assetq.complete_run(conn, first, "success")
    assert run_row(db, run.dag_id, run.run_id) == before


def test_runs_lists_runs_of_every_consumer_by_state(db: TestDatabase) -> None:
    runs = make_runs(db, 3)
    (claim,) = assetq.claim_runs(db.engine, "w1")
    with db.engine.connect() as conn:
        running = assetq.runs(conn, state="running")
        queued = assetq.runs(conn, state="queued")
    assert [(r.id, r.worker, r.attempt) for r in running] == [(claim.id, "w1", 1)]
    assert sorted(r.id for r in queued) == [r.id for r in runs if r.id != claim.id]


# -- bad input ------------------------------------------------------------------------------


def _bad_engine_calls(claim: assetq.Claim) -> list[tuple[str, Any, type[Exception]]]:
    nan = math.nan
    return [
        ("claim-empty-worker", lambda e: assetq.claim_runs(e, ""), assetq.InvalidArgument),
        ("claim-worker-not-str", lambda e: assetq.claim_runs(e, 7), assetq.InvalidArgumentType),  # type: ignore[arg-type]
        ("claim-worker-too-long", lambda e: assetq.claim_runs(e, "w" * 251), assetq.NameTooLong),
        ("claim-limit-0", lambda e: assetq.claim_runs(e, "w", limit=0), assetq.InvalidArgument),
        (
            "claim-limit-1001",
            lambda e: assetq.claim_runs(e, "w", limit=1001),
            assetq.InvalidArgument,
        ),
        (
            "claim-limit-bool",
            lambda e: assetq.claim_runs(e, "w", limit=True),
            assetq.InvalidArgumentType,
        ),
        (
            "claim-lease-negative",
            lambda e: assetq.claim_runs(e, "w", lease=-1),
            assetq.InvalidArgument,
        ),
        ("claim-lease-zero", lambda e: assetq.claim_runs(e, "w", lease=0), assetq.InvalidArgument),
        ("claim-lease-nan", lambda e: assetq.claim_runs(e, "w", lease=nan), assetq.InvalidArgument),
        (
            "claim-lease-inf",
            lambda e: assetq.claim_runs(e, "w", lease=math.inf),
            assetq.InvalidArgument,
        ),
        (
            "claim-lease-over-a-week",
            lambda e: assetq.claim_runs(e, "w", lease=604_801),
            assetq.InvalidArgument,
        ),
        (
            "claim-lease-str",
            lambda e: assetq.claim_runs(e, "w", lease="60"),  # type: ignore[arg-type]
            assetq.InvalidArgumentType,
        ),
        (
            "claim-dag-ids-str",
            lambda e: assetq.claim_runs(e, "w", dag_ids="report"),
            assetq.InvalidArgumentType,
        ),
        (
            "claim-dag-ids-bad-id",
            lambda e: assetq.claim_runs(e, "w", dag_ids=["a b"]),
            assetq.InvalidArgument,
        ),
        (
            "heartbeat-not-a-claim",
            lambda e: assetq.heartbeat(e, "report"),  # type: ignore[arg-type]
            assetq.InvalidArgumentType,
        ),
        (
            "heartbeat-run-info",
            lambda e: assetq.heartbeat(e, _as_run(claim)),  # type: ignore[arg-type]
            assetq.InvalidArgumentType,
        ),
        (
            "heartbeat-lease-negative",
            lambda e: assetq.heartbeat(e, claim, lease=-5),
            assetq.InvalidArgument,
        ),
        (
            "heartbeat-lease-nan",
            lambda e: assetq.heartbeat(e, claim, lease=nan),
            assetq.InvalidArgument,
        ),
    ]


def _as_run(claim: assetq.Claim) -> assetq.Run:
    return assetq.Run(
        id=claim.id,
        dag_id=claim.dag_id,
        run_id=claim.run_id,
        seq=claim.seq,
        run_after=claim.run_after,
        created_at=claim.created_at,
        event_ids=claim.event_ids,
    )


def _bad_connection_calls(claim: assetq.Claim) -> list[tuple[str, Any, type[Exception]]]:
    out = [assetq.NewEvent(OUTPUT)]
    return [
        (
            "complete-not-a-claim",
            lambda c: assetq.complete_run(c, _as_run(claim), "success"),  # type: ignore[arg-type]
            assetq.InvalidArgumentType,
        ),
        (
            "complete-state-sucess",
            lambda c: assetq.complete_run(c, claim, "sucess"),  # type: ignore[arg-type]
            assetq.InvalidRunState,
        ),
        (
            "complete-state-running",
            lambda c: assetq.complete_run(c, claim, "running"),  # type: ignore[arg-type]
            assetq.InvalidRunState,
        ),
        (
            "complete-failed-with-events",
            lambda c: assetq.complete_run(c, claim, "failed", events=out),
            assetq.InvalidArgument,
        ),
        (
            "complete-events-str",
            lambda c: assetq.complete_run(c, claim, "success", events=OUTPUT),  # type: ignore[arg-type]
            assetq.InvalidArgumentType,
        ),
        (
            "complete-event-no-asset",
            lambda c: assetq.complete_run(c, claim, "success", events=[{"extra": {}}]),
            assetq.InvalidArgument,
        ),
        (
            "complete-event-bad-extra",
            lambda c: assetq.complete_run(
                c, claim, "success", events=[{"asset": OUTPUT, "extra": [1]}]
            ),
            assetq.InvalidArgument,
        ),
        (
            "complete-error-not-str",
            lambda c: assetq.complete_run(c, claim, "failed", error=42),  # type: ignore[arg-type]
            assetq.InvalidArgumentType,
        ),
        (
            "retry-bad-dag-id",
            lambda c: assetq.retry_run(c, "a b", claim.run_id),
            assetq.InvalidArgument,
        ),
        (
            "retry-empty-run-id",
            lambda c: assetq.retry_run(c, claim.dag_id, ""),
            assetq.InvalidArgument,
        ),
        (
            "declare-max-attempts-0",
            lambda c: assetq.declare_dag(c, "d", "orders", max_attempts=0),
            assetq.InvalidArgument,
        ),
        (
            "declare-max-attempts-1001",
            lambda c: assetq.declare_dag(c, "d", "orders", max_attempts=1001),
            assetq.InvalidArgument,
        ),
        (
            "declare-retry-delay-negative",
            lambda c: assetq.declare_dag(c, "d", "orders", retry_delay=-1),
            assetq.InvalidArgument,
        ),
        (
            "declare-retry-delay-nan",
            lambda c: assetq.declare_dag(c, "d", "orders", retry_delay=math.nan),
            assetq.InvalidArgument,
        ),
        (
            "declare-max-retry-delay-below-delay",
            lambda c: assetq.declare_dag(c, "d", "orders", retry_delay=5, max_retry_delay=1),
            assetq.InvalidArgument,
        ),
    ]


def test_bad_arguments_of_the_worker_calls_are_refused_before_anything_is_sent(
    db: TestDatabase,
) -> None:
    """Each call raises its InvalidArgument subclass without sending a statement; nothing in
    the database changed."""
    one_run(db)
    (claim,) = assetq.claim_runs(db.engine, "w1")
    counts = db.counts()
    rows = db.rows("SELECT * FROM {ns}.dag_run")
    watcher = Statements(db.engine)
    for name, call, error in _bad_engine_calls(claim):
        with watcher.watching() as sent:
            with pytest.raises(error):
                call(db.engine)
            assert sent == [], name
    with db.engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))
        conn.rollback()
        for name, call, error in _bad_connection_calls(claim):
            with watcher.watching() as sent:
                with pytest.raises(error):
                    call(conn)
                assert sent == [], name
            assert not conn.in_transaction(), name
            conn.rollback()
    assert db.counts() == counts
    assert db.rows("SELECT * FROM {ns}.dag_run") == rows


# Parameter types of the routines called directly, for PostgreSQL's casts; MySQL procedures
# take the same parameters in the same order (all of them: NULL stands for a default).
SIGNATURES = {
    "claim_runs": ("text", "integer", "double precision", "jsonb"),
    "heartbeat_run": ("text", "text", "integer", "double precision"),
    "complete_run": ("text", "text", "integer", "text", "text", "jsonb"),
    "retry_run": ("text", "text"),
    "declare_dag": (
        "text",
        "jsonb",
        "jsonb",
        "boolean",
        "integer",
        "integer",
        "boolean",
        "integer",
        "double precision",
        "double precision",
    ),
}


def _direct(db: TestDatabase, routine: str, *args: Any) -> list[sa.Row[Any]]:
    """Call ``routine`` with SQL, no Python check in front, in a transaction of its own."""
    types = SIGNATURES[routine]
    args = args + (None,) * (len(types) - len(args))
    params = {f"p{i}": value for i, value in enumerate(args)}
    if db.dialect.name == "postgresql":
        placeholders = ", ".join(f"CAST(:p{i} AS {t})" for i, t in enumerate(types))
        sql = f"SELECT * FROM {{ns}}.{routine}({placeholders})"
    else:
        placeholders = ", ".join(f":p{i}" for i in range(len(types)))
        sql = f"CALL {{ns}}.{routine}({placeholders})"
    with db.engine.connect() as conn:
        dialect = db.dialect
        try:
            with conn.begin():
                result = conn.execute(sa.text(db.sql(sql)), params)
                return list(result.all()) if result.returns_rows else []
        except sa.exc.DBAPIError as exc:
            raise dialect.translate(exc) from exc


_CONDITION = ('{"asset":"orders"}', '[["orders"]]')


#: NaN is sent as the text 'NaN'. PostgreSQL casts it to the float NaN, which passes every
#: comparison a careless check makes (NaN > 0 and NaN <= 0 are both false): the routine
#: refuses it. MySQL has no NaN: the server refuses the text before the routine runs (1366).
NAN_REFUSED = ("AQ002", "1366")


def _direct_cases(claim: assetq.Claim) -> list[tuple[str, tuple[Any, ...], str | tuple[str, ...]]]:
    """(case, routine and arguments, the code (or codes) it must raise)."""
    held = (claim.dag_id, claim.run_id, claim.attempt)
    return [
        ("claim-empty-worker", ("claim_runs", "", 1, 60, None), "AQ002"),
        ("claim-null-worker", ("claim_runs", None, 1, 60, None), "AQ002"),
        ("claim-worker-too-long", ("claim_runs", "w" * 251, 1, 60, None), "AQ002"),
        ("claim-limit-0", ("claim_runs", "w", 0, 60, None), "AQ002"),
        ("claim-limit-1001", ("claim_runs", "w", 1001, 60, None), "AQ002"),
        ("claim-limit-null", ("claim_runs", "w", None, 60, None), "AQ002"),
        ("claim-lease-negative", ("claim_runs", "w", 1, -1, None), "AQ002"),
        ("claim-lease-zero", ("claim_runs", "w", 1, 0, None), "AQ002"),
        ("claim-lease-null", ("claim_runs", "w", 1, None, None), "AQ002"),
        ("claim-lease-over-a-week", ("claim_runs", "w", 1, 604_801, None), "AQ002"),
        ("claim-dag-ids-not-array", ("claim_runs", "w", 1, 60, '"report"'), "AQ002"),
        ("claim-dag-ids-numbers", ("claim_runs", "w", 1, 60, "[1, 2]"), "AQ002"),
        ("claim-lease-nan", ("claim_runs", "w", 1, "NaN", None), NAN_REFUSED),
        ("heartbeat-lease-negative", ("heartbeat_run", *held, -1), "AQ002"),
        ("heartbeat-lease-nan", ("heartbeat_run", *held, "NaN"), NAN_REFUSED),
        ("heartbeat-lease-null", ("heartbeat_run", *held, None), "AQ002"),
        ("complete-state-sucess", ("complete_run", *held, "sucess", None, None), "AQ008"),
        ("complete-state-running", ("complete_run", *held, "running", None, None), "AQ008"),
        ("complete-state-null", ("complete_run", *held, None, None, None), "AQ008"),
        (
            "complete-failed-with-events",
            ("complete_run", *held, "failed", "x", '[{"asset": "orders"}]'),
            "AQ002",
        ),
        (
            "complete-stale-attempt",
            ("complete_run", claim.dag_id, claim.run_id, 2, "success", None, None),
            "AQ010",
        ),
        (
            "complete-null-attempt",
            ("complete_run", claim.dag_id, claim.run_id, None, "success", None, None),
            "AQ010",
        ),
        ("retry-a-running-run", ("retry_run", claim.dag_id, claim.run_id), "AQ008"),
        (
            "declare-max-attempts-0",
            ("declare_dag", "d", *_CONDITION, None, None, None, None, 0),
            "AQ002",
        ),
        (
            "declare-max-attempts-1001",
            ("declare_dag", "d", *_CONDITION, None, None, None, None, 1001),
            "AQ002",
        ),
        (
            "declare-retry-delay-negative",
            ("declare_dag", "d", *_CONDITION, None, None, None, None, 3, -1),
            "AQ002",
        ),
        (
            "declare-max-retry-delay-below-delay",
            ("declare_dag", "d", *_CONDITION, None, None, None, None, 3, 5, 1),
            "AQ002",
        ),
    ]


def test_the_worker_routines_called_with_sql_refuse_bad_arguments_and_write_nothing(
    db: TestDatabase,
) -> None:
    one_run(db)
    one_run(db, "queued_one", "invoices")
    (claim,) = assetq.claim_runs(db.engine, "w1", dag_ids=["report"])
    counts = db.counts()
    rows = db.rows("SELECT * FROM {ns}.dag_run ORDER BY id")
    wrong = []
    for name, (routine, *args), code in _direct_cases(claim):
        try:
            _direct(db, routine, *args)
        except assetq.AssetqError as exc:
            if exc.code not in ((code,) if isinstance(code, str) else code):
                wrong.append((name, exc.code, str(exc)[:200]))
        else:
            wrong.append((name, "no error", ""))
    assert wrong == []
    assert db.counts() == counts
    assert db.rows("SELECT * FROM {ns}.dag_run ORDER BY id") == rows
