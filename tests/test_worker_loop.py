"""The worker loop (assetq.run_worker), worker processes killed with kill -9, the scheduler
loop reaching every ready consumer, and a soak of workers that fail and die (issue 12; I8,
I9, I10), on both engines.

A worker process here is real: ``sys.executable`` running tests/work_scenario.py, which
claims runs through assetq, writes its rows in the transaction that would complete them,
says so on stdout and blocks until it is killed with SIGKILL (or told to complete late, as
a zombie). Every wait has a deadline; leases are waited for on the database's clock.
"""

from __future__ import annotations

import json
import os
import random
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
import assetq.worker
from dbs import Backend, TestDatabase
from work_scenario import (
    OUTPUT_ASSET,
    Statements,
    WorkerProcess,
    claim_until,
    create_effect_table,
    db_now,
    declare,
    effects,
    events_from,
    expire_lease,
    join_all,
    make_runs,
    one_run,
    register,
    run_row,
    tuples,
    wait_for,
    wait_past,
    write_effect,
)

OUTPUT = "sales_report"


class Worker:
    """run_worker in a thread, with a deadline: a worker that never returns fails the test
    (after being told to stop) instead of hanging it."""

    def __init__(self, engine: sa.Engine, handlers: dict[str, Any], **options: Any) -> None:
        self.stop: threading.Event = options.setdefault("stop", threading.Event())
        self.stats: assetq.WorkerStats | None = None
        self.error: BaseException | None = None

        def target() -> None:
            try:
                self.stats = assetq.run_worker(engine, handlers, **options)
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=target, name="test-worker")
        self.thread.start()

    def join(self, deadline: float = 30.0) -> assetq.WorkerStats:
        self.thread.join(deadline)
        if self.thread.is_alive():
            self.stop.set()
            self.thread.join(30)
            raise AssertionError(f"run_worker did not return within {deadline:g} s")
        if self.error is not None:
            raise self.error
        assert self.stats is not None
        return self.stats


def _queued_for(db: TestDatabase, dag_id: str) -> list[int]:
    return [
        int(r[0])
        for r in db.rows(
            "SELECT asset_event_id FROM {ns}.asset_dag_run_queue WHERE target_dag_id = :d"
            " ORDER BY 1",
            d=dag_id,
        )
    ]


# -- handlers -------------------------------------------------------------------------------


def test_a_handlers_write_commits_with_the_success_and_its_returned_events_are_registered(
    db: TestDatabase,
) -> None:
    create_effect_table(db)
    declare(db, "downstream", OUTPUT)
    run = one_run(db)
    calls: list[tuple[assetq.Claim, bool, list[Any]]] = []

    def handler(claim: assetq.Claim, conn: sa.Connection) -> list[assetq.NewEvent]:
        write_effect(conn, claim)
        # Not committed yet: the write waits for the completion, in this transaction.
        calls.append((claim, conn.in_transaction(), effects(db)))
        return [assetq.NewEvent(OUTPUT, extra={"rows": 7})]

    stats = Worker(
        db.engine, {"report": handler}, worker="w1", max_runs=1, poll_interval=0.2
    ).join()
    ((claim, in_transaction, seen_outside),) = calls
    assert isinstance(claim, assetq.Claim)
    assert (claim.id, claim.attempt, claim.worker, claim.event_ids) == (
        run.id,
        1,
        "w1",
        run.event_ids,
    )
    assert in_transaction and seen_outside == []
    assert (stats.claimed, stats.succeeded, stats.failed, stats.lost) == (1, 1, 0, 0)
    assert effects(db) == [("report", run.run_id, 1, "w1")]
    assert run_row(db, "report", run.run_id)["state"] == "success"
    (output,) = events_from(db, "report", run.run_id)
    assert _queued_for(db, "downstream") == [output]


def test_a_handler_that_raises_fails_the_attempt_rolls_back_its_write_and_stores_the_error(
    db: TestDatabase,
) -> None:
    create_effect_table(db)
    run = one_run(db, max_attempts=1)

    def handler(claim: assetq.Claim, conn: sa.Connection) -> None:
        write_effect(conn, claim)
        raise ValueError("kaput 42")

    stats = Worker(
        db.engine, {"report": handler}, worker="w1", max_runs=1, poll_interval=0.2
    ).join()
    assert (stats.succeeded, stats.failed) == (0, 1)
    assert effects(db) == []
    row = run_row(db, "report", run.run_id)
    assert (row["state"], row["attempt"]) == ("failed", 1)
    assert "ValueError" in row["error"] and "kaput 42" in row["error"]
    assert events_from(db, "report", run.run_id) == []


def test_the_heartbeat_renews_the_lease_while_a_slow_handler_runs(db: TestDatabase) -> None:
    """The handler blocks until the database's clock is past the lease it was claimed with
    and the stored lease has moved past it; meanwhile another worker finds nothing to claim
    (with two attempts, an expired lease would be claimable)."""
    run = one_run(db, max_attempts=2)
    seen: dict[str, Any] = {}

    def handler(claim: assetq.Claim, conn: sa.Connection) -> None:
        assert claim.lease_until is not None
        first = claim.lease_until

        def renewed_and_past() -> tuple[Any, Any] | None:
            lease = run_row(db, "report", run.run_id)["lease_until"]
            now = db_now(db)
            return (lease, now) if lease > first and now > first else None

        seen["lease"], seen["now"] = wait_for("the lease to be renewed", renewed_and_past)
        seen["first"] = first
        seen["thief"] = assetq.claim_runs(db.engine, "thief")

    stats = Worker(
        db.engine,
        {"report": handler},
        worker="w1",
        lease=1.5,
        heartbeat_interval=0.25,
        max_runs=1,
        poll_interval=0.2,
    ).join()
    assert seen["thief"] == []
    assert seen["lease"] > seen["first"] and seen["now"] > seen["first"]
    assert stats.succeeded == 1 and stats.lost == 0
    row = run_row(db, "report", run.run_id)
    assert (row["state"], row["attempt"], row["worker"]) == ("success", 1, "w1")


def test_a_worker_whose_run_was_taken_over_meanwhile_rolls_back_its_handler_and_counts_it_lost(
    db: TestDatabase,
) -> None:
    """While the handler runs, the lease is ended (the heartbeat is 300 s away) and another
    worker claims the run: the handler's completion is refused, its write rolled back."""
    create_effect_table(db)
    declare(db, "downstream", OUTPUT)
    run = one_run(db, max_attempts=2)
    taken: list[assetq.Claim] = []
    outcomes: list[tuple[int, str, object]] = []

    def handler(claim: assetq.Claim, conn: sa.Connection) -> list[assetq.NewEvent]:
        write_effect(conn, claim)
        expire_lease(db, claim.id)
        taken.extend(assetq.claim_runs(db.engine, "successor"))
        return [assetq.NewEvent(OUTPUT)]

    stats = Worker(
        db.engine,
        {"report": handler},
        worker="w1",
        lease=600,
        heartbeat_interval=300,
        max_runs=1,
        poll_interval=0.2,
        on_complete=lambda claim, info, outcome: outcomes.append((claim.attempt, outcome, info)),
    ).join()
    assert [(c.id, c.attempt) for c in taken] == [(run.id, 2)]
    assert outcomes == [(1, "lost", None)]
    assert (stats.lost, stats.succeeded, stats.failed) == (1, 0, 0)
    assert effects(db) == []
    assert events_from(db, "report", run.run_id) == []
    row = run_row(db, "report", run.run_id)
    assert (row["state"], row["attempt"], row["worker"]) == ("running", 2, "successor")


def test_concurrency_runs_one_run_per_slot_at_the_same_time(db: TestDatabase) -> None:
    """Three handlers wait for each other at a barrier: with fewer than three slots running
    at once it breaks and the runs fail."""
    create_effect_table(db)
    runs = make_runs(db, 3)
    barrier = threading.Barrier(3)

    def handler(claim: assetq.Claim, conn: sa.Connection) -> None:
        barrier.wait(timeout=20)
        write_effect(conn, claim)

    stats = Worker(
        db.engine,
        {r.dag_id: handler for r in runs},
        worker="pool",
        concurrency=3,
        max_runs=3,
        poll_interval=0.2,
    ).join(60)
    assert (stats.succeeded, stats.failed) == (3, 0)
    done = effects(db)
    assert sorted((d, r) for d, r, _, _ in done) == sorted((r.dag_id, r.run_id) for r in runs)
    assert sorted(w for _, _, _, w in done) == ["pool#1", "pool#2", "pool#3"]


def test_stop_ends_the_worker_after_the_current_run_which_commits(db: TestDatabase) -> None:
    create_effect_table(db)
    first, second = make_runs(db, 2)
    stop = threading.Event()
    calls: list[int] = []

    def handler(claim: assetq.Claim, conn: sa.Connection) -> None:
        stop.set()  # asked to stop while this run is in progress
        calls.append(claim.id)
        write_effect(conn, claim)

    stats = Worker(
        db.engine,
        {first.dag_id: handler, second.dag_id: handler},
        worker="w1",
        stop=stop,
        poll_interval=0.2,
    ).join()
    assert calls == [first.id]
    assert stats.succeeded == 1
    assert effects(db) == [(first.dag_id, first.run_id, 1, "w1")]
    assert run_row(db, first.dag_id, first.run_id)["state"] == "success"
    left = run_row(db, second.dag_id, second.run_id)
    assert (left["state"], left["attempt"], left["worker"]) == ("queued", 0, None)


def _claims_sent(engine: sa.Engine) -> list[int]:
    """A counter of the claim statements ``engine`` has sent (list of one int)."""
    sent = [0]

    def count(*args: Any) -> None:
        if "claim_runs" in str(args[2]):
            sent[0] += 1

    sa.event.listen(engine, "after_cursor_execute", count)
    return sent


def test_an_idle_worker_is_woken_by_the_notification_when_a_pass_creates_runs(
    backend: Backend, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its first idle wait is made as long as the poll (30 s), so only the notification can
    end it within the test's 20 s deadline; the run is created after that first, empty
    claim. (The engine is asked before a database is made for the test.)"""
    if not backend.dialect.supports_notify:
        pytest.skip("no notifications on this engine: workers poll (the next test)")
    db: TestDatabase = request.getfixturevalue("db")
    monkeypatch.setattr(assetq.worker, "IDLE_FIRST", 30.0)
    declare(db, "report", "orders")
    engine = db.new_engine()
    sent = _claims_sent(engine)
    done: list[int] = []
    worker = Worker(
        engine,
        {"report": lambda claim, conn: done.append(claim.id)},
        worker="idle",
        poll_interval=30,
        max_runs=1,
    )
    wait_for("the worker's first claim", lambda: sent[0] >= 1)
    wait_for(
        "the worker's listener",
        lambda: db.scalar(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'LISTEN %'"
        ),
    )
    register(db, "orders")
    (run,) = assetq.schedule(db.engine)
    stats = worker.join(20)
    assert done == [run.id]
    assert stats.wakeups >= 1
    assert sent[0] == 2  # the empty claim, and the one the wake-up started


def test_an_idle_worker_without_notifications_finds_new_runs_by_polling(
    db: TestDatabase,
) -> None:
    declare(db, "report", "orders")
    engine = db.new_engine()
    sent = _claims_sent(engine)
    done: list[int] = []
    worker = Worker(
        engine,
        {"report": lambda claim, conn: done.append(claim.id)},
        worker="poller",
        poll_interval=0.2,
        listen=False,
        max_runs=1,
    )
    wait_for("the worker's first claim", lambda: sent[0] >= 1)
    register(db, "orders")
    (run,) = assetq.schedule(db.engine)
    stats = worker.join(20)
    assert done == [run.id]
    assert stats.wakeups == 0 and stats.succeeded == 1


def test_run_worker_refuses_bad_arguments_before_it_starts(db: TestDatabase) -> None:
    """Refused before anything is sent. The stop event is set already: a call that were not
    refused would return at once instead of running for good."""

    def handler(claim: assetq.Claim, conn: sa.Connection) -> None:
        return None

    stopped = threading.Event()
    stopped.set()

    def start(handlers: Any = None, **options: Any) -> Callable[[], object]:
        chosen = {"report": handler} if handlers is None else handlers
        return lambda: assetq.run_worker(db.engine, chosen, stop=stopped, **options)

    bad: list[tuple[Callable[[], object], type[Exception]]] = [
        (start({}), assetq.InvalidArgumentType),
        (start(["report"]), assetq.InvalidArgumentType),
        (start({"report": 42}), assetq.InvalidArgumentType),
        (start({"a b": handler}), assetq.InvalidArgument),
        (start(concurrency=0), assetq.InvalidArgument),
        (start(concurrency=257), assetq.InvalidArgument),
        (start(worker=""), assetq.InvalidArgument),
        (start(lease=-1), assetq.InvalidArgument),
        (start(lease=float("nan")), assetq.InvalidArgument),
        (start(lease=3, heartbeat_interval=3), assetq.InvalidArgument),
        (start(poll_interval=0), assetq.InvalidArgument),
        (start(max_runs=0), assetq.InvalidArgument),
    ]
    watcher = Statements(db.engine)
    for number, (call, error) in enumerate(bad):
        with watcher.watching() as sent:
            with pytest.raises(error):
                call()
            assert sent == [], number


# -- worker processes killed with kill -9 ---------------------------------------------------


@pytest.mark.parametrize("mode", ["hold", "hold_completed"])
def test_a_killed_worker_process_runs_are_claimed_again_after_its_lease_with_the_same_events(
    db: TestDatabase, mode: str
) -> None:
    """``hold``: killed while its rows are written but not committed; ``hold_completed``:
    killed after complete_run (success, an output event) but before its commit, holding the
    runs' row locks. Either way its rows and output events never appear."""
    create_effect_table(db)
    declare(db, "downstream", OUTPUT_ASSET)
    runs = make_runs(db, 2, max_attempts=3)
    child = WorkerProcess(db, "doomed", mode, limit=2, lease=1.0)
    try:
        held = child.holding()
        assert [(h.run_id, h.attempt, h.event_ids) for h in held] == [
            (r.run_id, 1, r.event_ids) for r in runs
        ]
        counts = db.counts()
        child.kill9()
    finally:
        child.close()
    lease_end = max(h.lease_until for h in held)
    again: list[assetq.Claim] = []
    while len(again) < 2:
        again += claim_until(db, "rescuer", limit=2)
    assert sorted((c.run_id, c.attempt, c.event_ids) for c in again) == sorted(
        (r.run_id, 2, r.event_ids) for r in runs
    )
    assert all(c.started_at is not None and c.started_at >= lease_end for c in again)
    assert effects(db) == []
    assert [events_from(db, r.dag_id, r.run_id) for r in runs] == [[], []]
    assert _queued_for(db, "downstream") == []
    after = db.counts()
    assert {k: after[k] for k in ("asset_event", "asset_dag_run_queue", "dagrun_asset_event")} == {
        k: counts[k] for k in ("asset_event", "asset_dag_run_queue", "dagrun_asset_event")
    }
    with db.engine.begin() as conn:
        for claim in again:
            write_effect(conn, claim)
            assetq.complete_run(conn, claim, "success", events=[assetq.NewEvent(OUTPUT_ASSET)])
    assert effects(db) == sorted((r.dag_id, r.run_id, 2, "rescuer") for r in runs)
    assert len(_queued_for(db, "downstream")) == 2


def test_a_zombie_process_completing_after_its_run_was_claimed_again_is_refused(
    db: TestDatabase,
) -> None:
    """The process holds its claim (and an open transaction with its row) while its lease
    expires and another worker claims the run; then it completes and commits: refused,
    rolled back, nothing of it left."""
    create_effect_table(db)
    declare(db, "downstream", OUTPUT_ASSET)
    run = one_run(db, max_attempts=2)
    child = WorkerProcess(db, "zombie", "zombie", lease=1.0)
    try:
        (held,) = child.holding()
        wait_past(db, held.lease_until)
        (current,) = claim_until(db, "successor")
        assert (current.id, current.attempt, current.event_ids) == (run.id, 2, run.event_ids)
        before = run_row(db, run.dag_id, run.run_id)
        counts = db.counts()
        child.send("go")
        assert child.expect("DONE") == "lease_lost AQ010"
    finally:
        child.close()
    assert effects(db) == []
    assert events_from(db, run.dag_id, run.run_id) == []
    assert db.counts() == counts
    assert run_row(db, run.dag_id, run.run_id) == before
    with db.engine.begin() as conn:
        write_effect(conn, current)
        assetq.complete_run(conn, current, "success")
    assert effects(db) == [(run.dag_id, run.run_id, 2, "successor")]


def test_a_capped_consumer_whose_worker_was_killed_goes_on_to_its_next_run(
    db: TestDatabase,
) -> None:
    """Three consumers with max_active_runs=1, their runs held by one worker process, which
    is killed; each has a new event waiting at its cap. After the lease:

    * ``reclaimed`` (2 attempts): another worker claims the run (attempt 2) and finishes it;
    * ``claim_reaped`` (1 attempt): the next claim fails the run (its last lease expired);
    * ``pass_reaped`` (1 attempt): nobody claims it; the pass at the cap fails the run.

    Then one pass creates the next run of each."""
    create_effect_table(db)
    specs = {"reclaimed": 2, "claim_reaped": 1, "pass_reaped": 1}
    for dag_id, attempts in specs.items():
        declare(db, dag_id, f"in_{dag_id}", max_active_runs=1, max_attempts=attempts)
    register(db, *(f"in_{d}" for d in specs))
    first = {r.dag_id: r for r in assetq.schedule(db.engine)}
    child = WorkerProcess(db, "doomed", "hold", limit=3, lease=1.0)
    try:
        held = child.holding()
        child.kill9()
    finally:
        child.close()
    assert sorted(h.dag_id for h in held) == sorted(specs)
    waiting = {
        e.id: d for d, e in zip(specs, register(db, *(f"in_{d}" for d in specs)), strict=True)
    }
    lease_end = max(h.lease_until for h in held)
    blocked = assetq.schedule(db.engine)
    if db_now(db) < lease_end:  # (a machine stalled past the lease: the pass may reap)
        assert blocked == []  # every one at its cap
    wait_past(db, lease_end)

    (rescued,) = claim_until(db, "rescuer", limit=2, dag_ids=["reclaimed", "claim_reaped"])
    assert (rescued.dag_id, rescued.attempt) == ("reclaimed", 2)
    reaped = run_row(db, "claim_reaped", first["claim_reaped"].run_id)
    assert (reaped["state"], reaped["attempt"]) == ("failed", 1)
    assert "expired" in reaped["error"]
    assert run_row(db, "pass_reaped", first["pass_reaped"].run_id)["state"] == "running"
    with db.engine.begin() as conn:
        assetq.complete_run(conn, rescued, "success")

    following = {r.dag_id: r for r in blocked + assetq.schedule(db.engine)}
    assert sorted(following) == sorted(specs)
    assert {r.event_ids: d for d, r in following.items()} == {(e,): d for e, d in waiting.items()}
    assert all(r.seq == 2 for r in following.values())
    passed = run_row(db, "pass_reaped", first["pass_reaped"].run_id)
    assert (passed["state"], passed["attempt"]) == ("failed", 1)
    assert "expired" in passed["error"]
    assert run_row(db, "reclaimed", first["reclaimed"].run_id)["state"] == "success"


# -- the scheduler loop reaches every ready consumer (issue 12 item 7) ----------------------


def test_the_scheduler_loop_reaches_a_ready_consumer_behind_a_window_of_blocked_ones(
    db: TestDatabase,
) -> None:
    """limit=1 and a 30 s poll: five consumers ahead of the ready one fill every window (three
    whose condition is not met, two at their cap with events waiting). The loop passes again
    at once while consumers are left unexamined, so the sixth pass creates the run, long
    before a poll could come (the deadline is 20 s)."""
    for n in range(3):
        declare(db, f"b{n}", assetq.all_of("p", "q"))
    for n in range(2):
        declare(db, f"c{n}", "r", max_active_runs=1)
    declare(db, "z", assetq.all_of("s", "t"))
    register(db, "p", "r", "s")
    # One pass over all of them: c0 and c1 get their run (their cap); the others wait. It
    # examines them in the order b0, b1, b2, c0, c1, z: the order of the next passes.
    assert sorted(r.dag_id for r in assetq.schedule(db.engine, limit=100)) == ["c0", "c1"]
    register(db, "r", "t")  # c0 and c1 wait at their cap; z is ready now
    created: list[assetq.Run] = []
    stop = threading.Event()

    def on_run(run: assetq.Run) -> None:
        created.append(run)
        if run.dag_id == "z":
            stop.set()

    result: list[assetq.SchedulerStats] = []
    loop = threading.Thread(
        target=lambda: result.append(
            assetq.run_scheduler(
                db.engine, limit=1, poll_interval=30, max_passes=6, stop_event=stop, on_run=on_run
            )
        )
    )
    loop.start()
    loop.join(20)
    waited = loop.is_alive()
    stop.set()
    loop.join(60)
    assert not waited, "the loop waited for its poll while a ready consumer was not reached"
    assert [r.dag_id for r in created] == ["z"]
    assert result and result[0].runs == 1


# -- soak -----------------------------------------------------------------------------------

#: Runs of the long soak (pytest -m slow); ASSETQ_SOAK_RUNS sets it.
LONG_SOAK_RUNS = int(os.environ.get("ASSETQ_SOAK_RUNS", "2000"))
SOAK_CONSUMERS = 10
SOAK_OUT = "soak_out"


@pytest.mark.parametrize(
    ("runs", "threads", "deadline"),
    [
        (60, 4, 60.0),
        pytest.param(LONG_SOAK_RUNS, 8, 1200.0, marks=pytest.mark.slow, id="long"),
    ],
)
def test_soak_every_run_ends_with_exactly_one_committed_effect_and_one_output_event(
    db: TestDatabase, runs: int, threads: int, deadline: float
) -> None:
    """R runs (10 consumers, max_attempts 50), worked by W hand-rolled worker threads and one
    run_worker (two slots) at once, until every run is finished. Short (60 runs, 4 threads,
    a few seconds) in the default suite; long with ``-m slow`` (ASSETQ_SOAK_RUNS runs, 2000
    by default, 8 threads).

    A hand-rolled worker claims 1 to 3 runs under a 0.5 s lease and, per claim, at random:
    dies (abandons it: no heartbeat, no completion; it comes back when the lease expires),
    fails (writes its row, rolls back, completes as failed), stalls past its lease and then
    completes (refused if someone claimed the run meanwhile), or succeeds: its row, the
    success and an output event in one transaction. The run_worker's handler writes its row
    and raises one time in four. The first claims of the first threads are forced to die, to
    fail and to stall, so every kind of fault happens in every run of the test.

    In the end: every run succeeded; each has exactly one effect row, written by the attempt
    and the worker that succeeded; each has exactly one output event, queued once for the
    consumer downstream; nothing else was registered."""
    create_effect_table(db)
    dag_ids = [f"soak_{n:02d}" for n in range(SOAK_CONSUMERS)]
    with db.engine.begin() as conn:
        for dag_id in dag_ids:
            assetq.declare_dag(conn, dag_id, "soak_in", max_attempts=50)
        assetq.declare_dag(conn, "soak_sink", SOAK_OUT)
    made = 0
    while made < runs:
        register(db, "soak_in")
        made += len(assetq.schedule(db.engine, limit=SOAK_CONSUMERS))
    runs = made
    engine = db.new_engine(pool_size=threads + 8, max_overflow=4)
    done = threading.Event()
    tally: Counter[str] = Counter()
    lock = threading.Lock()
    failures: list[BaseException] = []
    forced = {0: "die", 1: "fail", 2: "stall"}

    def count(what: str) -> None:
        with lock:
            tally[what] += 1

    def succeed(claim: assetq.Claim) -> None:
        try:
            with engine.connect() as conn, conn.begin():
                write_effect(conn, claim)
                assetq.complete_run(
                    conn,
                    claim,
                    "success",
                    events=[assetq.NewEvent(SOAK_OUT, extra={"attempt": claim.attempt})],
                )
            count("succeeded")
        except assetq.LeaseLost:
            count("refused")

    def hand_rolled(n: int) -> None:
        rng = random.Random(1000 + n)
        fate = forced.get(n)
        try:
            while not done.is_set():
                claims = assetq.claim_runs(engine, f"hand_{n}", limit=rng.randint(1, 3), lease=0.5)
                if not claims:
                    done.wait(0.02)
                    continue
                for claim in claims:
                    roll = rng.random()
                    fate = fate or (
                        "die" if roll < 0.08 else "fail" if roll < 0.3 else "stall" if roll < 0.38
                        else "succeed"
                    )  # fmt: skip
                    if fate == "die":
                        count("died")
                    elif fate == "fail":
                        with engine.connect() as conn:
                            conn.begin()
                            write_effect(conn, claim)
                            conn.rollback()  # what a raising handler's transaction does
                            try:
                                with conn.begin():
                                    assetq.complete_run(conn, claim, "failed", error="soak")
                                count("failed")
                            except assetq.LeaseLost:
                                count("refused")
                    else:
                        if fate == "stall":
                            assert claim.lease_until is not None
                            wait_past(db, claim.lease_until)
                            count("stalled")
                        succeed(claim)
                    fate = None
        except BaseException as exc:
            failures.append(exc)
            done.set()

    def handler(claim: assetq.Claim, conn: sa.Connection) -> list[assetq.NewEvent]:
        write_effect(conn, claim)
        if random.random() < 0.25:
            raise RuntimeError("soak handler failure")
        return [assetq.NewEvent(SOAK_OUT, extra={"attempt": claim.attempt})]

    workers = [threading.Thread(target=hand_rolled, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    looped = Worker(
        engine,
        dict.fromkeys(dag_ids, handler),
        worker="looped",
        concurrency=2,
        lease=2,
        poll_interval=0.1,
        stop=done,
    )
    try:
        wait_for(
            "every run to finish",
            lambda: (
                failures
                or not db.scalar(
                    "SELECT count(*) FROM {ns}.dag_run WHERE state IN ('queued', 'running')"
                )
            ),
            deadline=deadline,
            every=0.2,
        )
    finally:
        done.set()
        join_all(workers, deadline=60)
        stats = looped.join(60)
    assert failures == []

    assert tally["died"] >= 1 and tally["failed"] >= 1 and tally["stalled"] >= 1, tally
    final = {
        (str(r[0]), str(r[1])): (str(r[2]), int(r[3]), str(r[4]))
        for r in tuples(db, "SELECT dag_id, run_id, state, attempt, worker FROM {ns}.dag_run")
        if str(r[0]) != "soak_sink"
    }
    assert len(final) == runs
    assert Counter(state for state, _, _ in final.values()) == Counter({"success": runs})
    # Exactly one committed effect per run, by the attempt and the worker that succeeded.
    written = effects(db)
    assert Counter((d, r) for d, r, _, _ in written) == Counter(dict.fromkeys(final, 1))
    assert {(d, r): (a, w) for d, r, a, w in written} == {
        key: (attempt, worker) for key, (_, attempt, worker) in final.items()
    }
    # Exactly one output event per run, from its successful attempt, queued once downstream.
    outputs = tuples(
        db,
        "SELECT id, source_dag_id, source_run_id, extra FROM {ns}.asset_event e"
        " WHERE e.asset_id = (SELECT id FROM {ns}.asset WHERE name = :a)",
        a=SOAK_OUT,
    )
    assert Counter((str(o[1]), str(o[2])) for o in outputs) == Counter(dict.fromkeys(final, 1))
    assert {
        (str(o[1]), str(o[2])): (o[3] if isinstance(o[3], dict) else json.loads(o[3]))["attempt"]
        for o in outputs
    } == {key: attempt for key, (_, attempt, _) in final.items()}
    assert sorted(_queued_for(db, "soak_sink")) == sorted(int(o[0]) for o in outputs)
    assert tally["succeeded"] + stats.succeeded == runs


def test_a_kept_connection_lost_between_claims_is_replaced_and_the_claim_made_on_the_engine(
    db: TestDatabase,
) -> None:
    """A slot's kept connection (assetq.worker.KeptConnection) whose server session was
    killed: the next claim finds it lost, is made on the Engine instead (whose path retries
    lost connections as before), and the claim after connects anew."""
    make_runs(db, 2)
    kept = assetq.worker.KeptConnection(db.engine)
    try:
        (first,) = kept.call(assetq.claim_runs, "w1", dag_ids=["job_000"])
        conn = kept.connection()
        assert conn is not None
        backend = conn.execute(db.engine_sql("backend_id")).scalar_one()
        assert kept.connection() is conn  # kept: the same connection for every call
        db.kill(conn)
        (second,) = kept.call(assetq.claim_runs, "w1", dag_ids=["job_001"])
        assert (first.dag_id, second.dag_id) == ("job_000", "job_001")
        again = kept.connection()
        assert again is not None and again is not conn
        assert again.execute(db.engine_sql("backend_id")).scalar_one() != backend
        assert kept.call(assetq.claim_runs, "w1") == []
    finally:
        kept.close()


def test_a_slot_whose_connection_is_killed_by_its_handler_fails_that_attempt_and_goes_on(
    db: TestDatabase,
) -> None:
    """The handler kills the server session of the connection it was given (on PostgreSQL
    the slot's kept connection) on attempt 1: that attempt's completion fails and is
    recorded as failed, and the slot claims and completes attempt 2 on a new connection."""
    run = one_run(db, max_attempts=2)
    outcomes: list[tuple[int, str]] = []
    sessions: list[object] = []

    def handler(claim: assetq.Claim, conn: sa.Connection) -> None:
        sessions.append(conn.execute(db.engine_sql("backend_id")).scalar_one())
        if claim.attempt == 1:
            db.kill(conn)

    stats = Worker(
        db.engine,
        {"report": handler},
        worker="w1",
        max_runs=2,
        poll_interval=0.2,
        on_complete=lambda claim, info, outcome: outcomes.append((claim.attempt, outcome)),
    ).join(60)
    assert outcomes == [(1, "failed"), (2, "success")]
    assert (stats.succeeded, stats.failed) == (1, 1)
    assert len(set(sessions)) == 2
    row = run_row(db, "report", run.run_id)
    assert (row["state"], row["attempt"]) == ("success", 2)


def test_a_worker_keeps_connections_only_where_its_pool_has_room_for_them() -> None:
    """One kept per slot and the heartbeat's (psycopg: the handler's transaction shares its
    slot's), plus a handler's own elsewhere: a pool without room for them leaves every call
    on the Engine, as before, instead of making slots wait for connections."""
    from sqlalchemy.pool import NullPool

    keeps = assetq.worker.keeps_connections
    pg = "postgresql+psycopg://u@127.0.0.1/d"
    my = "mysql+pymysql://u@127.0.0.1/d"
    assert keeps(sa.create_engine(pg, pool_size=8, max_overflow=2), 8)
    assert not keeps(sa.create_engine(pg, pool_size=8, max_overflow=1), 8)
    assert keeps(sa.create_engine(my, pool_size=18, max_overflow=0), 8)
    assert not keeps(sa.create_engine(my, pool_size=5, max_overflow=10), 8)
    assert keeps(sa.create_engine(my, pool_size=5, max_overflow=-1), 8)
    assert keeps(sa.create_engine(pg, poolclass=NullPool), 256)
