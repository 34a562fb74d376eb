"""Attempt history (issue 27: the run page's attempts and timeline; `assetq run show`): every
attempt a run's update ends is recorded in dag_run_attempt by the trigger dag_run_attempt_end,
whichever path ends it (a completion, a failure and its retry, a timeout ended by the next
claim, a cancel, an expired lease claimed again); claims, heartbeats and passes record
nothing. Both engines. Times are moved in the row, never slept through.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

import assetq
from assetq import ops
from dbs import TestDatabase
from work_scenario import expire_lease, one_run, run_row

_AGED = (
    "UPDATE {ns}.dag_run SET started_at = started_at - INTERVAL '1' HOUR,"
    " deadline = deadline - INTERVAL '1' HOUR, lease_until = lease_until - INTERVAL '1' HOUR,"
    " not_before = not_before - INTERVAL '1' HOUR WHERE id = :id"
)


def _recorded(db: TestDatabase, run_pk: int) -> list[tuple[int, str, str | None, str | None]]:
    """(attempt, outcome, worker, error) of run ``run_pk``'s recorded attempts, oldest first."""
    rows = db.rows(
        "SELECT attempt, outcome, worker, error FROM {ns}.dag_run_attempt"
        " WHERE dag_run_id = :id ORDER BY attempt",
        id=run_pk,
    )
    return [(int(r.attempt), str(r.outcome), r.worker, r.error) for r in rows]


def _attempts(db: TestDatabase, run: assetq.Run) -> list[ops.Attempt]:
    with db.engine.connect() as conn:
        info = assetq.get_run(conn, run.dag_id, run.run_id, namespace=db.namespace)
        return ops.run_attempts(conn, info, namespace=db.namespace)


def test_a_failure_retried_then_a_success_are_two_attempts(db: TestDatabase) -> None:
    """Each attempt with its own worker, claim time, end and error; the success has none.
    Claims and heartbeats record nothing."""
    run = one_run(db, max_attempts=3, retry_delay=0)
    (first,) = assetq.claim_runs(db.engine, "w-1")
    assetq.heartbeat(db.engine, first)
    assert _recorded(db, run.id) == []
    with db.engine.begin() as conn:
        assetq.complete_run(conn, first, "failed", error="Traceback\nValueError: <b>boom</b>")
    (second,) = assetq.claim_runs(db.engine, "w-2")
    assetq.heartbeat(db.engine, second)
    assert _recorded(db, run.id) == [(1, "failed", "w-1", "Traceback\nValueError: <b>boom</b>")]
    running = _attempts(db, run)
    assert [(a.attempt, a.outcome, a.worker) for a in running] == [
        (2, "running", "w-2"),
        (1, "failed", "w-1"),
    ]
    assert running[0].ended_at is None and running[0].started_at == second.started_at
    with db.engine.begin() as conn:
        assetq.complete_run(conn, second, "success")
    assert _recorded(db, run.id) == [
        (1, "failed", "w-1", "Traceback\nValueError: <b>boom</b>"),
        (2, "success", "w-2", None),
    ]
    done = _attempts(db, run)
    assert [(a.attempt, a.outcome) for a in done] == [(2, "success"), (1, "failed")]
    assert done[1].started_at == first.started_at
    assert done[1].ended_at is not None and done[0].ended_at is not None
    assert done[1].started_at <= done[1].ended_at <= done[0].started_at <= done[0].ended_at


def test_a_timed_out_attempt_ended_by_the_next_claim_is_recorded(db: TestDatabase) -> None:
    run = one_run(db, max_attempts=2, timeout=30, retry_delay=0)
    (claim,) = assetq.claim_runs(db.engine, "dead", lease=600)
    db.execute(_AGED, id=claim.id)
    (again,) = assetq.claim_runs(db.engine, "next")
    assert again.attempt == 2
    assert _recorded(db, run.id) == [(1, "failed", "dead", "timed out after 30s")]


def test_an_expired_lease_claimed_again_is_recorded_as_expired(db: TestDatabase) -> None:
    run = one_run(db, max_attempts=3)
    (claim,) = assetq.claim_runs(db.engine, "lost")
    expire_lease(db, claim.id)
    lease_until = run_row(db, claim.dag_id, claim.run_id)["lease_until"]
    (again,) = assetq.claim_runs(db.engine, "taker")
    assert again.attempt == 2
    ((attempt, outcome, worker, error),) = _recorded(db, run.id)
    assert (attempt, outcome, worker) == (1, "expired", "lost")
    assert error is not None and "attempt 2" in error and "taker" in error
    (ended,) = [a for a in _attempts(db, run) if a.attempt == 1]
    assert ended.ended_at == lease_until  # when its lease ran out, not when it was taken


def test_a_cancel_ends_the_running_attempt_and_a_queued_cancel_ends_none(
    db: TestDatabase,
) -> None:
    run = one_run(db, max_attempts=3)
    (claim,) = assetq.claim_runs(db.engine, "holder")
    with db.engine.begin() as conn:
        assetq.cancel_run(conn, claim.dag_id, claim.run_id, reason="wrong input")
    assert _recorded(db, run.id) == [(1, "cancelled", "holder", "cancelled: wrong input")]
    # Retried, then cancelled while queued: no attempt ended, nothing more recorded.
    with db.engine.begin() as conn:
        assetq.retry_run(conn, claim.dag_id, claim.run_id)
        assetq.cancel_run(conn, claim.dag_id, claim.run_id)
    assert len(_recorded(db, run.id)) == 1


def test_a_run_moved_by_hand_records_no_attempt(db: TestDatabase) -> None:
    run = one_run(db)
    with db.engine.begin() as conn:
        assetq.set_run_state(conn, run.dag_id, run.run_id, "running")
        assetq.set_run_state(conn, run.dag_id, run.run_id, "success")
    assert _recorded(db, run.id) == []
    assert _attempts(db, run) == []


def test_a_run_whose_attempt_ended_before_the_history_shows_it_from_its_row(
    db: TestDatabase,
) -> None:
    """An attempt that ended before revision 0003_run_attempts has no row: run_attempts gives
    the run's own last attempt instead (deleting the row stands for that)."""
    run = one_run(db)
    (claim,) = assetq.claim_runs(db.engine, "old")
    with db.engine.begin() as conn:
        assetq.complete_run(conn, claim, "failed", error="before the history")
    db.execute("DELETE FROM {ns}.dag_run_attempt WHERE dag_run_id = :id", id=run.id)
    (only,) = _attempts(db, run)
    assert (only.attempt, only.outcome, only.worker, only.error) == (
        1,
        "failed",
        "old",
        "before the history",
    )


def test_attempts_go_with_their_run(db: TestDatabase) -> None:
    run = one_run(db)
    (claim,) = assetq.claim_runs(db.engine, "w")
    with db.engine.begin() as conn:
        assetq.complete_run(conn, claim, "success")
    assert len(_recorded(db, run.id)) == 1
    with db.engine.begin() as conn:
        assetq.delete_dag(conn, run.dag_id)
    assert db.scalar("SELECT COUNT(*) FROM {ns}.dag_run_attempt") == 0


@pytest.mark.parametrize("limit", [1, 2])
def test_run_attempts_limit_keeps_the_newest(db: TestDatabase, limit: int) -> None:
    run = one_run(db, max_attempts=3, retry_delay=0)
    for worker in ("w-1", "w-2"):
        (claim,) = assetq.claim_runs(db.engine, worker)
        with db.engine.begin() as conn:
            assetq.complete_run(conn, claim, "failed", error=f"{worker} failed")
    with db.engine.connect() as conn:
        info = assetq.get_run(conn, run.dag_id, run.run_id, namespace=db.namespace)
        found = ops.run_attempts(conn, info, limit=limit, namespace=db.namespace)
    assert [a.attempt for a in found] == [2, 1][:limit]
    assert timedelta(0) <= found[0].ended_at - found[0].started_at  # type: ignore[operator]
