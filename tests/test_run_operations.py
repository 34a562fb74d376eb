"""Operating runs (issue 26): cancellation and timeouts, in the routines and fenced like
everything else, on both engines.

Time is never slept through: an attempt is made to run past its deadline by moving its
claim's times an hour back in the row (the holder's own view of the clock does not matter:
the routines decide on the database's). Races are forced: one side holds the run's lock in
an open transaction while the other side runs in a thread, with a deadline, and the first
commits only then.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
from dbs import TestDatabase
from work_scenario import (
    WorkerProcess,
    create_effect_table,
    db_now,
    effects,
    join_all,
    make_runs,
    one_run,
    run_events,
    run_row,
    seconds_between,
    write_effect,
)

#: An hour back: the claim's start, deadline, lease and not_before of a running run, as if
#: the attempt had run for an hour.
_AGED = (
    "UPDATE {ns}.dag_run SET started_at = started_at - INTERVAL '1' HOUR,"
    " deadline = deadline - INTERVAL '1' HOUR, lease_until = lease_until - INTERVAL '1' HOUR,"
    " not_before = not_before - INTERVAL '1' HOUR WHERE id = :id"
)


def _run_past_its_deadline(db: TestDatabase, claim: assetq.Claim) -> assetq.Claim:
    """The claim's attempt an hour older, in the row and in the claim returned: its
    started_at is the claim's fencing token (lock_claim), moved with the row."""
    assert claim.deadline is not None and claim.started_at is not None
    db.execute(_AGED, id=claim.id)
    return replace(claim, started_at=claim.started_at - timedelta(hours=1))


def _state(db: TestDatabase, claim: assetq.Run) -> tuple[str, int, str | None]:
    row = run_row(db, claim.dag_id, claim.run_id)
    return row["state"], row["attempt"], row["error"]


# -- cancellation --------------------------------------------------------------------------


def test_a_queued_run_cancelled_is_never_claimed_and_frees_its_place(db: TestDatabase) -> None:
    run = one_run(db, max_active_runs=1)
    with db.engine.begin() as conn:
        info = assetq.cancel_run(conn, run.dag_id, run.run_id, reason="wrong input")
    assert (info.state, info.error, info.attempt) == ("cancelled", "cancelled: wrong input", 0)
    assert info.ended_at is not None and info.not_before is None
    assert assetq.claim_runs(db.engine, "w") == []
    # Not counted in max_active_runs: the next event makes the next run at once.
    with db.engine.begin() as conn:
        assetq.register_event(conn, "orders")
    (second,) = assetq.schedule(db.engine)
    assert second.dag_id == run.dag_id and second.seq == run.seq + 1
    # Its events stay consumed by the cancelled run.
    assert len(run_events(db, run.dag_id, run.run_id)) == 1


def test_a_running_run_cancelled_fences_its_holder(db: TestDatabase) -> None:
    """The holder's heartbeat and its completion (with its own write and an output event)
    are refused, nothing it wrote commits; the run stays cancelled."""
    create_effect_table(db)
    one_run(db, max_attempts=3)
    (claim,) = assetq.claim_runs(db.engine, "holder")
    with db.engine.begin() as conn:
        info = assetq.cancel_run(conn, claim.dag_id, claim.run_id)
    assert (info.state, info.error, info.worker) == ("cancelled", "cancelled", "holder")
    with pytest.raises(assetq.LeaseLost, match="cancelled"):
        assetq.heartbeat(db.engine, claim)
    counts = db.counts()
    for state in ("success", "failed"):
        with db.engine.connect() as conn:
            conn.begin()
            write_effect(conn, claim)
            with pytest.raises(assetq.LeaseLost):
                if state == "success":
                    assetq.complete_run(conn, claim, "success", events=[assetq.NewEvent("out")])
                else:
                    assetq.complete_run(conn, claim, "failed", error="late")
            conn.rollback()
    assert effects(db) == [] and db.counts() == counts
    assert _state(db, claim) == ("cancelled", 1, "cancelled")
    assert assetq.claim_runs(db.engine, "other") == []


@pytest.mark.parametrize("final", ["success", "failed", "cancelled"])
def test_cancelling_a_final_run_is_refused_and_writes_nothing(db: TestDatabase, final: str) -> None:
    run = one_run(db)
    if final == "cancelled":
        with db.engine.begin() as conn:
            assetq.cancel_run(conn, run.dag_id, run.run_id)
    else:
        (claim,) = assetq.claim_runs(db.engine, "w")
        with db.engine.begin() as conn:
            assetq.complete_run(conn, claim, final, error="boom" if final == "failed" else None)
    before = run_row(db, run.dag_id, run.run_id)
    with (
        db.engine.connect() as conn,
        pytest.raises(assetq.InvalidRunState) as refused,
        conn.begin(),
    ):
        assetq.cancel_run(conn, run.dag_id, run.run_id, reason="again")
    assert refused.value.code == "AQ008"
    assert f"is {final}" in str(refused.value) and "queued or running" in str(refused.value)
    assert run_row(db, run.dag_id, run.run_id) == before


def test_cancelling_an_unknown_run_or_consumer_says_so(db: TestDatabase) -> None:
    one_run(db)
    for dag_id, run_id in (("report", "nope"), ("nobody", "nope")):
        with db.engine.connect() as conn, pytest.raises(assetq.UnknownRun), conn.begin():
            assetq.cancel_run(conn, dag_id, run_id)
    with db.engine.connect() as conn, pytest.raises(assetq.InvalidArgumentType):
        assetq.cancel_run(conn, "report", "r", reason=3)  # type: ignore[arg-type]


def test_retry_run_queues_a_cancelled_run_again_with_its_events(db: TestDatabase) -> None:
    run = one_run(db)
    events = run_events(db, run.dag_id, run.run_id)
    (claim,) = assetq.claim_runs(db.engine, "w")
    with db.engine.begin() as conn:
        assetq.cancel_run(conn, run.dag_id, run.run_id)
    with db.engine.begin() as conn:
        again = assetq.retry_run(conn, run.dag_id, run.run_id)
    assert (again.state, again.ended_at) == ("queued", None)
    (next_claim,) = assetq.claim_runs(db.engine, "w")
    assert (next_claim.run_id, next_claim.attempt) == (run.run_id, claim.attempt + 1)
    assert next_claim.event_ids == events


@pytest.mark.parametrize("first", ["completion", "cancel"])
def test_a_cancel_racing_a_completion_exactly_one_wins(db: TestDatabase, first: str) -> None:
    """The first one takes the run's lock in a transaction it keeps open while the second
    starts (and waits for the lock); the first commits, then the second is refused with
    nothing written: a cancelled run is not completed, a completed one not cancelled."""
    create_effect_table(db)
    one_run(db)
    (claim,) = assetq.claim_runs(db.engine, "holder")
    outcome: dict[str, Any] = {}

    def complete(conn: sa.Connection) -> None:
        write_effect(conn, claim)
        assetq.complete_run(conn, claim, "success")

    def cancel(conn: sa.Connection) -> None:
        assetq.cancel_run(conn, claim.dag_id, claim.run_id, reason="operator")

    moves = {"completion": complete, "cancel": cancel}
    second = "cancel" if first == "completion" else "completion"

    def run_second() -> None:
        try:
            with db.engine.connect() as conn, conn.begin():
                moves[second](conn)
            outcome[second] = "done"
        except assetq.AssetqError as exc:
            outcome[second] = exc

    with db.engine.connect() as conn:
        conn.begin()
        moves[first](conn)
        thread = threading.Thread(target=run_second, daemon=True)
        thread.start()
        thread.join(1.0)
        assert thread.is_alive(), "the second party did not wait for the run's lock"
        conn.commit()
    join_all([thread], deadline=30)
    lost = outcome[second]
    if first == "completion":
        assert isinstance(lost, assetq.InvalidRunState), lost
        assert _state(db, claim)[0] == "success" and len(effects(db)) == 1
    else:
        assert isinstance(lost, assetq.LeaseLost), lost
        assert _state(db, claim) == ("cancelled", 1, "cancelled: operator")
        assert effects(db) == []


# -- timeouts ------------------------------------------------------------------------------


def test_a_claim_sets_the_deadline_and_caps_the_lease_at_it(db: TestDatabase) -> None:
    """The consumer's timeout wins over the worker's default; the worker's default holds for a
    consumer that declares none; no timeout at all: no deadline, the whole lease. A heartbeat
    never takes the lease past the deadline."""
    make_runs(db, 1, prefix="own", timeout=timedelta(seconds=30))
    make_runs(db, 1, prefix="plain")
    claims = {
        c.dag_id: c for c in assetq.claim_runs(db.engine, "w", limit=2, lease=600, timeout=90)
    }
    own, plain = claims["own_000"], claims["plain_000"]
    assert own.deadline is not None and own.started_at is not None
    assert seconds_between(own.deadline, own.started_at) == pytest.approx(30, abs=1e-3)
    assert own.lease_until == own.deadline
    assert plain.deadline is not None and plain.started_at is not None
    assert seconds_between(plain.deadline, plain.started_at) == pytest.approx(90, abs=1e-3)
    renewed = assetq.heartbeat(db.engine, own)
    assert renewed.lease_until == own.deadline and renewed.deadline == own.deadline
    with db.engine.connect() as conn:  # the stored run says it too
        assert assetq.get_run(conn, own.dag_id, own.run_id).deadline == own.deadline
    make_runs(db, 1, prefix="free")
    (free,) = assetq.claim_runs(db.engine, "w", lease=600, dag_ids=["free_000"])
    assert free.deadline is None and free.started_at is not None and free.lease_until is not None
    assert seconds_between(free.lease_until, free.started_at) == pytest.approx(600, abs=1e-3)


def test_past_its_deadline_a_live_holder_is_fenced_but_may_record_the_failure(
    db: TestDatabase,
) -> None:
    """The worker loop's path at its deadline: heartbeat and success refused (its writes roll
    back), then the failure it records ("timed out after 30s") is retried by max_attempts."""
    create_effect_table(db)
    one_run(db, max_attempts=2, timeout=30)
    (claim,) = assetq.claim_runs(db.engine, "holder")
    claim = _run_past_its_deadline(db, claim)
    with pytest.raises(assetq.LeaseLost, match="timed out"):
        assetq.heartbeat(db.engine, claim)
    counts = db.counts()
    with db.engine.connect() as conn:
        conn.begin()
        write_effect(conn, claim)
        with pytest.raises(assetq.LeaseLost, match="timed out"):
            assetq.complete_run(conn, claim, "success", events=[assetq.NewEvent("out")])
        conn.rollback()
    assert effects(db) == [] and db.counts() == counts
    with db.engine.begin() as conn:
        info = assetq.complete_run(conn, claim, "failed", error="timed out after 30s")
    assert (info.state, info.error) == ("queued", "timed out after 30s")


@pytest.mark.parametrize("max_attempts", [1, 2])
def test_a_dead_holders_timed_out_attempt_is_ended_by_the_next_claim(
    db: TestDatabase, max_attempts: int
) -> None:
    """The holder never comes back: the next claim ends its attempt as timed out, retried
    (after the retry delay, not claimed by this claim) or failed for good; the holder, if it
    ever returns, is fenced."""
    one_run(db, max_attempts=max_attempts, timeout=30, retry_delay=120)
    (claim,) = assetq.claim_runs(db.engine, "dead", lease=600)
    claim = _run_past_its_deadline(db, claim)
    assert assetq.claim_runs(db.engine, "next") == []
    state, attempt, error = _state(db, claim)
    assert (state, attempt, error) == (
        "queued" if max_attempts == 2 else "failed",
        1,
        "timed out after 30s",
    )
    row = run_row(db, claim.dag_id, claim.run_id)
    if max_attempts == 2:  # claimable after the retry delay, as after any failure
        assert seconds_between(row["not_before"], db_now(db)) > 100
    else:
        assert row["not_before"] is None and row["ended_at"] is not None
    with pytest.raises(assetq.LeaseLost):
        assetq.heartbeat(db.engine, claim)


def test_a_timed_out_attempt_frees_the_claim_for_the_next_run(db: TestDatabase) -> None:
    """The claim that ends a timed-out attempt goes on to the next claimable run."""
    runs = make_runs(db, 2, timeout=timedelta(seconds=5))
    (first,) = assetq.claim_runs(db.engine, "dead")
    assert first.id == runs[0].id
    _run_past_its_deadline(db, first)
    (taken,) = assetq.claim_runs(db.engine, "next")
    assert taken.id == runs[1].id
    assert _state(db, first) == ("failed", 1, "timed out after 5s")


def test_a_bad_timeout_is_refused_with_nothing_written(db: TestDatabase) -> None:
    one_run(db)
    counts = db.counts()
    for bad in (0, -1, 604801, timedelta(days=8)):
        with db.engine.connect() as conn, pytest.raises(assetq.InvalidArgument), conn.begin():
            assetq.declare_dag(conn, "report", "orders", timeout=bad)
        with pytest.raises(assetq.InvalidArgument):
            assetq.claim_runs(db.engine, "w", timeout=bad)
    assert db.counts() == counts
    assert db.scalar("SELECT timeout_seconds FROM {ns}.dag WHERE dag_id = 'report'") is None


def test_a_redeclaration_replaces_the_timeout(db: TestDatabase) -> None:
    one_run(db, timeout=timedelta(minutes=2))
    assert db.scalar("SELECT timeout_seconds FROM {ns}.dag WHERE dag_id = 'report'") == 120
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
    assert db.scalar("SELECT timeout_seconds FROM {ns}.dag WHERE dag_id = 'report'") is None


# -- a partitioned declaration's blast radius ---------------------------------------------


def test_making_a_consumer_partitioned_is_refused_while_its_producers_send_unkeyed_events(
    db: TestDatabase,
) -> None:
    """The producers of orders send events without a partition key: declaring a consumer of
    it partitioned (an unpartitioned one re-declared, or a new one) is refused with the count,
    nothing written; with allow_unkeyed=True the new one is declared, and the next unkeyed
    event is refused as the message said. Re-declaring a partitioned consumer is not checked
    again."""
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "audit", "orders")
        for _ in range(3):
            assetq.register_event(conn, "orders")
        assetq.register_event(conn, "orders", partition_key="2026-12-01")
    counts = db.counts()
    for dag_id in ("audit", "daily"):
        with (
            db.engine.connect() as conn,
            pytest.raises(assetq.InvalidArgument) as refused,
            conn.begin(),
        ):
            assetq.declare_dag(conn, dag_id, "orders", partitioned=True)
        assert "3 of asset 'orders' carry none" in str(refused.value)
        assert "allow_unkeyed=True" in str(refused.value)
    assert db.counts() == counts
    assert db.scalar("SELECT partitioning FROM {ns}.dag WHERE dag_id = 'audit'") is None
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "daily", "orders", partitioned=True, allow_unkeyed=True)
    with db.engine.connect() as conn, pytest.raises(assetq.UnmappablePartition), conn.begin():
        assetq.register_event(conn, "orders")
    with db.engine.begin() as conn:  # already partitioned: no check
        assetq.declare_dag(conn, "daily", "orders", partitioned=True, max_active_runs=2)


def test_a_partitioned_consumer_on_keyed_producers_is_declared_without_a_word(
    db: TestDatabase,
) -> None:
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, "orders")
        assetq.declare_asset(conn, "other")
        assetq.register_event(conn, "orders", partition_key="2026-12-01")
        assetq.register_event(conn, "other")  # another asset's unkeyed event: not counted
        assetq.declare_dag(conn, "daily", "orders", partitioned=True)


def test_a_paused_holder_past_its_deadline_is_timed_out_and_fenced_when_it_resumes(
    db: TestDatabase,
) -> None:
    """A real worker process holds the run (its lease 600 s, far past the deadline), its
    write in its open transaction, and is stopped with SIGSTOP; its attempt runs past the
    deadline; the next claim ends it as timed out and claims the run again (no retry delay).
    Resumed (SIGCONT) and told to complete, the paused worker is refused (AQ010) and its write
    is rolled back."""
    create_effect_table(db)
    one_run(db, max_attempts=2, timeout=30)
    paused = WorkerProcess(db, "paused", "zombie", lease=600)
    try:
        (held,) = paused.holding()
        run_pk = db.scalar("SELECT id FROM {ns}.dag_run WHERE run_id = :r", r=held.run_id)
        os.kill(paused.process.pid, signal.SIGSTOP)
        try:
            db.execute(_AGED, id=run_pk)
            (successor,) = assetq.claim_runs(db.engine, "successor")
        finally:
            os.kill(paused.process.pid, signal.SIGCONT)
        assert (successor.run_id, successor.attempt) == (held.run_id, 2)
        assert run_row(db, "report", held.run_id)["error"] == "timed out after 30s"
        paused.send("go")
        assert paused.expect("DONE") == "lease_lost AQ010"
    finally:
        paused.close()
    assert effects(db) == []
    with db.engine.begin() as conn:
        assert assetq.complete_run(conn, successor, "success").state == "success"
