"""What a refused call on a run says, word for word, whoever refuses it.

heartbeat_run, complete_run, retry_run and set_run_state all begin by locking the run by
(dag_id, run_id): AQ006 when there is none; the two worker calls then refuse a run their
attempt no longer holds with AQ010 (I8). They share that step (the private routines
lock_run and lock_held_run), so these cases pin the exact text (and, on PostgreSQL, the hint)
each caller gave before, on raw calls with no Python in front: a sharing that changed one
word of one caller's message fails here. On MySQL a message is cut at 128 characters.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

import assetq
from dbs import TestDatabase
from work_scenario import one_run

TYPES = {
    "heartbeat_run": ("text", "text", "integer", "double precision"),
    "complete_run": ("text", "text", "integer", "text", "text", "jsonb"),
    "retry_run": ("text", "text"),
    "set_run_state": ("text", "text", "text"),
}
HEARTBEAT_HINT = "Stop working on it: another worker holds it now, or it was finished."
COMPLETE_HINT = "Roll back: another worker holds it now, or it was finished; nothing was written."
HELD_HINT = "If the worker died, the run is claimed again when its lease expires."
#: A dag id as long as the schema allows, and an unknown run id longer than any message.
LONG_DAG = "d" * 250
LONG_RUN = "it's " + "r" * 200

Refusal = tuple[str, str, str | None]


def refusal(db: TestDatabase, routine: str, *args: Any) -> Refusal:
    """(code, message, hint) of a raw call that must fail; hint None on MySQL."""
    types = TYPES[routine]
    args = args + (None,) * (len(types) - len(args))  # MySQL procedures have no defaults
    params = {f"p{i}": value for i, value in enumerate(args)}
    if db.dialect.name == "postgresql":
        casts = ", ".join(f"CAST(:p{i} AS {types[i]})" for i in range(len(args)))
        sql = f"SELECT * FROM {{ns}}.{routine}({casts})"
    else:
        sql = f"CALL {{ns}}.{routine}({', '.join(f':p{i}' for i in range(len(args)))})"
    with db.engine.connect() as conn, pytest.raises(sa.exc.DBAPIError) as raised, conn.begin():
        conn.execute(sa.text(db.sql(sql)), params)
    error = raised.value.orig
    if db.dialect.name == "postgresql":
        diag = error.diag  # type: ignore[union-attr]
        return str(error.sqlstate), str(diag.message_primary), diag.message_hint  # type: ignore[union-attr]
    number, message = error.args[0], str(error.args[1])  # type: ignore[union-attr]
    assert number == 1644, error
    code = message[1:6]
    return code, message, None


def expected(db: TestDatabase, code: str, message: str, hint: str | None = None) -> Refusal:
    """The refusal as each engine words it: MySQL puts the code in front and cuts at 128."""
    if db.dialect.name == "postgresql":
        return code, message, hint
    return code, f"[{code}] {message}"[:128], None


def mysql_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def test_an_unknown_run_is_refused_alike_by_every_caller(db: TestDatabase) -> None:
    run = one_run(db)
    calls: list[tuple[str, tuple[Any, ...]]] = [
        ("heartbeat_run", (run.dag_id, "nope", 1, 30.0)),
        ("complete_run", (run.dag_id, "nope", 1, "success", None, None)),
        ("retry_run", (run.dag_id, "nope")),
        ("set_run_state", (run.dag_id, "nope", "failed")),
    ]
    for routine, args in calls:
        assert refusal(db, routine, *args) == expected(
            db, "AQ006", f"unknown run 'nope' of dag '{run.dag_id}'"
        ), routine


def test_an_unknown_run_with_long_ids_is_cut_as_before(db: TestDatabase) -> None:
    one_run(db)
    calls: list[tuple[str, tuple[Any, ...]]] = [
        ("heartbeat_run", (LONG_DAG, LONG_RUN, 1, 30.0)),
        ("complete_run", (LONG_DAG, LONG_RUN, 1, "failed", "x", None)),
        ("retry_run", (LONG_DAG, LONG_RUN)),
        ("set_run_state", (LONG_DAG, LONG_RUN, "success")),
    ]
    for routine, args in calls:
        got = refusal(db, routine, *args)
        want: Refusal
        if db.dialect.name == "postgresql":
            want = expected(db, "AQ006", f"unknown run 'it''s {'r' * 200}' of dag '{LONG_DAG}'")
        else:
            want = (
                "AQ006",
                f"[AQ006] unknown run {mysql_quote(LONG_RUN[:60])} of dag"
                f" {mysql_quote(LONG_DAG[:40])}"[:128],
                None,
            )
        assert got == want, routine


def test_a_queued_run_is_not_held_by_any_attempt(db: TestDatabase) -> None:
    run = one_run(db)
    held = f"run {run.run_id!r} of dag {run.dag_id!r}"
    if db.dialect.name == "postgresql":
        base = f"lease lost: run {run.run_id} of dag {run.dag_id} is queued at attempt 0,"
        assert refusal(db, "heartbeat_run", run.dag_id, run.run_id, 1, 30.0) == (
            "AQ010",
            f"{base} not running at attempt 1",
            HEARTBEAT_HINT,
        )
        assert refusal(db, "complete_run", run.dag_id, run.run_id, None, "failed", "x") == (
            "AQ010",
            f"{base} not running at attempt NULL",
            COMPLETE_HINT,
        )
    else:
        base = "[AQ010] lease lost: the run is queued at attempt 0,"
        assert refusal(db, "heartbeat_run", run.dag_id, run.run_id, 1, 30.0) == (
            "AQ010",
            f"{base} not running at attempt 1; stop working on {held}"[:128],
            None,
        )
        assert refusal(db, "complete_run", run.dag_id, run.run_id, None, "failed", "x") == (
            "AQ010",
            f"{base} not running at attempt NULL; roll back: nothing was written for {held}"[:128],
            None,
        )


def test_a_run_moved_to_running_by_hand_has_no_lease(db: TestDatabase) -> None:
    run = one_run(db)
    with db.engine.begin() as conn:
        assetq.set_run_state(conn, run.dag_id, run.run_id, "running")
    want: Refusal
    if db.dialect.name == "postgresql":
        want = (
            "AQ010",
            f"lease lost: run {run.run_id} of dag {run.dag_id} is running at attempt 0,"
            " not running at attempt 0",
            HEARTBEAT_HINT,
        )
    else:
        want = (
            "AQ010",
            "[AQ010] lease lost: the run is running with no lease at attempt 0, not running at"
            f" attempt 0; stop working on run {run.run_id!r} of dag {run.dag_id!r}"[:128],
            None,
        )
    assert refusal(db, "heartbeat_run", run.dag_id, run.run_id, 0, 30.0) == want


def test_a_claimed_run_refuses_another_attempt_an_operator_and_a_retry(
    db: TestDatabase,
) -> None:
    run = one_run(db)
    (claim,) = assetq.claim_runs(db.engine, "w1", limit=1)
    assert (claim.id, claim.attempt) == (run.id, 1)
    if db.dialect.name == "postgresql":
        assert refusal(db, "complete_run", run.dag_id, run.run_id, 2, "success") == (
            "AQ010",
            f"lease lost: run {run.run_id} of dag {run.dag_id} is running at attempt 1,"
            " not running at attempt 2",
            COMPLETE_HINT,
        )
        assert refusal(db, "set_run_state", run.dag_id, run.run_id, "success") == (
            "AQ008",
            f"run {run.run_id} of dag {run.dag_id} is held by worker 'w1' (attempt 1): its"
            " worker completes it (assetq.complete_run)",
            HELD_HINT,
        )
        assert refusal(db, "retry_run", run.dag_id, run.run_id) == (
            "AQ008",
            f"run {run.run_id} of dag {run.dag_id} is running:"
            " only a failed or cancelled run can be retried",
            None,
        )
    else:
        assert refusal(db, "complete_run", run.dag_id, run.run_id, 2, "success") == (
            "AQ010",
            "[AQ010] lease lost: the run is running at attempt 1, not running at attempt 2;"
            f" roll back: nothing was written for run {run.run_id!r} of dag {run.dag_id!r}"[:128],
            None,
        )
        assert refusal(db, "set_run_state", run.dag_id, run.run_id, "success") == (
            "AQ008",
            f"[AQ008] run {run.run_id!r} is held by worker 'w1' (attempt 1): its worker"
            " completes it (assetq.complete_run)"[:128],
            None,
        )
        assert refusal(db, "retry_run", run.dag_id, run.run_id) == (
            "AQ008",
            f"[AQ008] run {run.run_id!r} is running: only a failed or cancelled run can be retried",
            None,
        )
    # The holder is undisturbed by every refusal.
    assert assetq.heartbeat(db.engine, claim).attempt == 1
