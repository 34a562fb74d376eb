"""The long-running scheduler (assetq.run_scheduler, `assetq scheduler`): passes until stopped,
finishes the pass it is in, survives errors, and on PostgreSQL wakes on NOTIFY.

Every test is deterministic: the loop is bounded by max_passes or stopped through its stop
event, and waits have generous timeouts that only catch a hang. The one timing assertion, the
NOTIFY wake-up, compares "seconds" against a 30-second poll interval.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

import assetq
from assetq import api
from dbs import TestDatabase


def _declare(db: TestDatabase, dag_id: str, condition: assetq.Condition) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, dag_id, condition)


def _register(db: TestDatabase, *assets: str) -> list[assetq.Event]:
    with db.engine.begin() as conn:
        return [assetq.register_event(conn, a) for a in assets]


#: High halves of the keys of the scheduler's advisory locks (sql/postgresql/queries.sql);
#: the low half is the queue table's oid. pg_locks shows them as classid and objid.
WAKEUP, BUSY = 0x61737471, 0x61737462


def _locks(db: TestDatabase, key: int, *, granted: bool, shared: bool = False) -> int:
    """Sessions holding (granted) or waiting for (not granted) one of the scheduler's locks."""
    return int(
        db.scalar(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
            " AND classid = :key AND objsubid = 1 AND mode = :mode"
            " AND objid = CAST(CAST('{ns}.asset_dag_run_queue' AS regclass) AS oid)"
            " AND granted = :granted",
            key=key,
            mode="ShareLock" if shared else "ExclusiveLock",
            granted=granted,
        )
    )


def _wakeup_lock(db: TestDatabase, *, granted: bool) -> int:
    """Schedulers holding or waiting for the wake-up lock: asking producers to notify."""
    return _locks(db, WAKEUP, granted=granted)


def _until(condition: Any, what: str, timeout: float = 60) -> None:
    """Wait for ``condition()`` to hold; only a hang makes this fail."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class _Loop:
    """run_scheduler in a thread, with events a test can wait for."""

    def __init__(self, db: TestDatabase, **kwargs: Any) -> None:
        self.stop = threading.Event()
        self.runs: queue.Queue[assetq.Run] = queue.Queue()
        self.first_pass = threading.Event()
        self.passes = 0  # successful passes so far
        self.stats: assetq.SchedulerStats | None = None
        self.error: BaseException | None = None
        on_pass_too = kwargs.pop("on_pass", None)

        def on_pass(runs: list[assetq.Run]) -> None:
            self.passes += 1
            self.first_pass.set()
            if on_pass_too is not None:
                on_pass_too(runs)

        def target() -> None:
            try:
                self.stats = assetq.run_scheduler(
                    db.engine,
                    namespace=db.namespace,
                    stop_event=self.stop,
                    on_run=self.runs.put,
                    on_pass=on_pass,
                    **kwargs,
                )
            except BaseException as exc:  # reported by finish()
                self.error = exc

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def finish(self) -> assetq.SchedulerStats:
        self.stop.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the scheduler did not stop"
        if self.error is not None:
            raise self.error
        assert self.stats is not None
        return self.stats


def test_the_loop_consumes_what_is_queued_and_returns_its_stats(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    events = _register(db, "orders", "orders", "orders")
    runs: list[assetq.Run] = []
    stats = assetq.run_scheduler(db.engine, max_passes=2, poll_interval=0.01, on_run=runs.append)
    assert [r.event_ids for r in runs] == [tuple(e.id for e in events)]
    assert (stats.passes, stats.runs, stats.events, stats.errors) == (2, 1, 3, 0)


def test_stopping_lets_the_current_pass_finish(db: TestDatabase) -> None:
    """The stop event is set while the pass is handing out its runs: the pass still commits
    and reports every run it created, then the loop ends without starting another."""
    for dag_id in ("first", "second", "third"):
        _declare(db, dag_id, "orders")
    (event,) = _register(db, "orders")
    stop = threading.Event()
    seen: list[str] = []

    def on_run(run: assetq.Run) -> None:
        seen.append(run.dag_id)
        stop.set()

    stats = assetq.run_scheduler(db.engine, stop_event=stop, on_run=on_run, poll_interval=30)
    assert sorted(seen) == ["first", "second", "third"]
    assert stats.passes == 1
    assert db.links() == sorted((d, event.id) for d in ("first", "second", "third"))


def test_an_idle_loop_picks_up_a_registration_by_polling(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    loop = _Loop(db, poll_interval=0.05, listen=False)
    try:
        assert loop.first_pass.wait(timeout=60)
        (event,) = _register(db, "orders")
        run = loop.runs.get(timeout=60)
    finally:
        stats = loop.finish()
    assert run.event_ids == (event.id,)
    assert stats.wakeups == 0


@pytest.mark.engines("postgresql")
def test_a_notification_wakes_an_idle_scheduler_long_before_its_poll(db: TestDatabase) -> None:
    """With a 30 s poll interval, a registration is consumed within seconds: the scheduler
    found nothing, took the wake-up lock, passed once more and waits; the commit of the
    producer notifies it on the namespace's channel."""
    assert db.dialect.supports_notify
    _declare(db, "consumer", "orders")
    loop = _Loop(db, poll_interval=30)
    try:
        # The first pass, the lock, the pass after it: now it waits.
        _until(lambda: loop.passes >= 2 and _wakeup_lock(db, granted=True) == 1, "the wait")
        started = time.monotonic()
        (event,) = _register(db, "orders")
        run = loop.runs.get(timeout=20)  # a hang here means no wake-up: the poll is 30 s
        waited = time.monotonic() - started
    finally:
        stats = loop.finish()
    assert run.event_ids == (event.id,)
    assert stats.wakeups >= 1
    assert stats.arms >= 1
    assert waited < 20


@pytest.mark.engines("postgresql")
def test_a_scheduler_that_wants_to_wait_first_waits_for_producers_that_did_not_notify(
    db: TestDatabase,
) -> None:
    """The interleaving a wake-up on demand must survive: a producer queues an event while no
    scheduler waits (so it will not notify) and commits late, after the scheduler's pass
    found nothing. The scheduler's request for the wake-up lock waits for that producer's
    transaction; once it commits, the pass made under the lock consumes the event, within
    seconds, with no notification and long before the 30 s poll."""
    _declare(db, "consumer", "orders")
    with db.engine.connect() as producer:
        event = assetq.register_event(producer, "orders")  # not committed yet
        loop = _Loop(db, poll_interval=30)
        try:
            _until(lambda: _wakeup_lock(db, granted=False) == 1, "the scheduler to wait")
            assert loop.passes == 1  # found nothing: the event is not committed
            assert loop.runs.empty()
            started = time.monotonic()
            producer.commit()
            run = loop.runs.get(timeout=20)  # a hang here means the event was missed
            waited = time.monotonic() - started
        finally:
            stats = loop.finish()
    assert run.event_ids == (event.id,)
    assert stats.wakeups == 0  # the producer did not notify: the lock's pass found it
    assert stats.arms >= 1
    assert waited < 20


@pytest.mark.engines("postgresql")
def test_a_busy_scheduler_gives_the_wake_up_lock_back(db: TestDatabase) -> None:
    """The lock is held from the first empty pass until a pass creates runs: producers notify
    only while the scheduler has nothing to do. Seen from the on_pass hook, which the loop
    calls after each pass and before it takes or gives back the lock."""
    _declare(db, "consumer", "orders")
    # (runs of the pass, wake-up lock holders, busy lock holders) per pass
    held_after: list[tuple[int, int, int]] = []

    def on_pass(runs: list[assetq.Run]) -> None:
        busy = _locks(db, BUSY, granted=True, shared=True)
        held_after.append((len(runs), _wakeup_lock(db, granted=True), busy))

    loop = _Loop(db, poll_interval=30, on_pass=on_pass)
    try:
        _until(lambda: loop.passes >= 2, "the pass under the lock")
        _register(db, "orders")
        loop.runs.get(timeout=20)
        _until(lambda: loop.passes >= 4, "the pass after the run")
    finally:
        stats = loop.finish()
    # Empty pass without the lock; empty pass under it; the woken pass that made the run,
    # still under it; the next pass, after the lock was given back and the busy lock taken.
    assert held_after[:4] == [(0, 0, 0), (0, 1, 0), (1, 1, 0), (0, 0, 1)]
    assert stats.wakeups >= 1


def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    """Whether the assetq logger logged a message containing ``text`` (under
    ``caplog.at_level(logging.DEBUG, logger="assetq")``)."""
    return any(text in record.getMessage() for record in caplog.records)


def _psycopg_url(db: TestDatabase) -> str:
    return db.url.set(drivername="postgresql").render_as_string(hide_password=False)


def _notifications_until_marker(db: TestDatabase, listener: psycopg.Connection[Any]) -> list[str]:
    """The channels of what ``listener`` received up to a marker notified now: notifications
    arrive in commit order, so that is everything committed before."""
    with db.engine.begin() as conn:
        conn.exec_driver_sql("NOTIFY aqo_marker")
    seen = []
    for note in listener.notifies(timeout=30):
        seen.append(note.channel)
        if note.channel == "aqo_marker":
            break
    return seen


@pytest.mark.engines("postgresql")
def test_while_another_scheduler_is_busy_an_idle_one_waits_for_it_and_nobody_notifies(
    db: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """Several schedulers: one that finds nothing while another is busy (holds the busy
    lock, as a loop whose passes create runs does) does not ask producers to notify; it
    waits for the busy one, which passes again anyway. A producer commits meanwhile: no
    notification. The busy one stops (here: gives the busy lock back): the waiting one
    takes the wake-up lock, passes under it and consumes the event, long before its poll."""
    _declare(db, "consumer", "orders")
    with (
        psycopg.connect(_psycopg_url(db), autocommit=True) as other,
        psycopg.connect(_psycopg_url(db), autocommit=True) as listener,
        caplog.at_level(logging.DEBUG, logger="assetq"),
    ):
        assert other.execute(db.dialect.query("busy_mark", db.namespace)).fetchone() == (True,)
        listener.execute(f'LISTEN "{db.namespace}"')
        listener.execute("LISTEN aqo_marker")
        loop = _Loop(db, poll_interval=30)
        try:
            _until(lambda: _logged(caplog, "another scheduler is busy"), "the idle one to wait")
            assert _wakeup_lock(db, granted=True) == _wakeup_lock(db, granted=False) == 0
            (event,) = _register(db, "orders")
            assert _notifications_until_marker(db, listener) == ["aqo_marker"]
            assert (loop.passes, loop.runs.empty()) == (1, True)
            other.execute(db.dialect.query("busy_unmark", db.namespace))
            run = loop.runs.get(timeout=20)  # a hang here means the event was left behind
        finally:
            stats = loop.finish()
    assert run.event_ids == (event.id,)
    assert stats.wakeups == 0
    assert stats.arms >= 1


@pytest.mark.engines("postgresql")
def test_a_waiting_scheduler_woken_for_nothing_while_another_is_busy_steps_back(
    db: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """A scheduler waits under the wake-up lock; another becomes busy; a notification wakes
    the first, whose pass finds nothing: it gives the wake-up lock back (producers stop
    notifying) and waits for the busy one instead."""
    _declare(db, "consumer", "orders")
    loop = _Loop(db, poll_interval=30)
    try:
        _until(lambda: loop.passes >= 2 and _wakeup_lock(db, granted=True) == 1, "the wait")
        with psycopg.connect(_psycopg_url(db), autocommit=True) as other:
            assert other.execute(db.dialect.query("busy_mark", db.namespace)).fetchone() == (True,)
            with caplog.at_level(logging.DEBUG, logger="assetq"):
                other.execute(f'NOTIFY "{db.namespace}"')  # a wake-up with nothing queued
                _until(lambda: _logged(caplog, "another scheduler is busy"), "the step back")
            assert _wakeup_lock(db, granted=True) == 0
            assert loop.passes == 3
            assert loop.runs.empty()
    finally:
        stats = loop.finish()
    assert stats.wakeups == 1


@pytest.mark.engines("postgresql")
def test_a_transaction_that_queues_events_sends_one_notification_at_commit(
    db: TestDatabase,
) -> None:
    """At most one notification per transaction (PostgreSQL folds identical ones), none for a
    rollback, none when nothing was queued. A marker on another channel, committed after,
    proves that nothing else came: notifications arrive in commit order."""
    _declare(db, "first", "orders")
    _declare(db, "second", "orders")
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, "unconsumed")
    url = _psycopg_url(db)
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{db.namespace}"')
        listener.execute("LISTEN aqo_marker")
        listener.execute(db.dialect.query("wakeup_arm", db.namespace))  # a scheduler waits

        with db.engine.begin() as conn:  # three events, two consumers: six queue rows
            for _ in range(3):
                assetq.register_event(conn, "orders")
            assetq.register_events(conn, [assetq.NewEvent("orders"), assetq.NewEvent("orders")])
        with db.engine.connect() as conn:  # rolled back
            assetq.register_event(conn, "orders")
            conn.rollback()
        _register(db, "unconsumed")  # queues nothing
        assert _notifications_until_marker(db, listener) == [db.namespace, "aqo_marker"]


@pytest.mark.engines("postgresql")
def test_producers_notify_only_while_a_scheduler_holds_the_wake_up_lock(
    db: TestDatabase,
) -> None:
    """No scheduler waits: a producer's commit sends nothing (its commit is not serialized
    with the others'). A session holds the lock: the next commit notifies. Given back: none
    again. A marker on another channel, committed after each step, shows what came when."""
    _declare(db, "consumer", "orders")
    url = _psycopg_url(db)
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{db.namespace}"')
        listener.execute("LISTEN aqo_marker")

        _register(db, "orders")  # no scheduler waits
        assert _notifications_until_marker(db, listener) == ["aqo_marker"]
        listener.execute(db.dialect.query("wakeup_arm", db.namespace))
        _register(db, "orders")  # a scheduler waits
        assert _notifications_until_marker(db, listener) == [db.namespace, "aqo_marker"]
        listener.execute(db.dialect.query("wakeup_disarm", db.namespace))
        _register(db, "orders")  # given back
        assert _notifications_until_marker(db, listener) == ["aqo_marker"]


def test_errors_are_logged_once_with_their_code_and_the_loop_recovers(
    db: TestDatabase, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _declare(db, "consumer", "orders")
    (event,) = _register(db, "orders")
    real_schedule = api.schedule
    failures = iter(range(3))

    def flaky(*args: Any, **kwargs: Any) -> list[assetq.Run]:
        if next(failures, None) is not None:
            raise assetq.DatabaseError("server is restarting", code="57P03")
        return real_schedule(*args, **kwargs)

    monkeypatch.setattr(api, "schedule", flaky)
    runs: list[assetq.Run] = []
    with caplog.at_level(logging.INFO, logger="assetq"):
        stats = assetq.run_scheduler(
            db.engine, max_passes=4, on_run=runs.append, backoff_initial=0.001, poll_interval=0.01
        )
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "57P03" in errors[0].getMessage()
    assert any("recovered after 3 failed passes" in r.getMessage() for r in caplog.records)
    assert (stats.passes, stats.errors) == (4, 3)
    assert [r.event_ids for r in runs] == [(event.id,)]


def test_a_namespace_without_assetq_is_an_error_the_loop_survives(
    db: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="assetq"):
        stats = assetq.run_scheduler(
            db.engine, namespace="aq_missing", max_passes=3, backoff_initial=0.001
        )
    assert (stats.passes, stats.errors, stats.runs) == (3, 3, 0)
    (record,) = caplog.records
    assert "pass failed" in record.getMessage()


def test_an_exception_of_on_run_ends_the_loop_and_the_run_stays_committed(
    db: TestDatabase,
) -> None:
    _declare(db, "consumer", "orders")
    (event,) = _register(db, "orders")

    def on_run(run: assetq.Run) -> None:
        raise RuntimeError("the caller's bug")

    with pytest.raises(RuntimeError, match="the caller's bug"):
        assetq.run_scheduler(db.engine, on_run=on_run, poll_interval=30)
    assert db.links() == [("consumer", event.id)]


def test_bad_arguments_are_refused_before_anything_runs(db: TestDatabase) -> None:
    with pytest.raises(assetq.InvalidArgument):
        assetq.run_scheduler(db.engine, poll_interval=0, max_passes=1)
    with pytest.raises(assetq.InvalidArgument):
        assetq.run_scheduler(db.engine, limit=0, max_passes=1)
    with pytest.raises(assetq.InvalidArgument):
        assetq.run_scheduler(db.engine, namespace="Bad-Name", max_passes=1)


# -- the command --------------------------------------------------------------------------


def _pump(stream: Any, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


@pytest.fixture
def scheduler_process(db: TestDatabase) -> Iterator[Any]:
    """Starts `python -m assetq scheduler` with the given arguments; its stdout and stderr
    lines are read into queues; the process is killed at teardown if still running."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> tuple[subprocess.Popen[str], queue.Queue[str], queue.Queue[str]]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASSETQ_")}
        env["ASSETQ_DATABASE_URL"] = db.url.render_as_string(hide_password=False)
        process = subprocess.Popen(
            [sys.executable, "-m", "assetq", "scheduler", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        started.append(process)
        out: queue.Queue[str] = queue.Queue()
        err: queue.Queue[str] = queue.Queue()
        for stream, lines in ((process.stdout, out), (process.stderr, err)):
            threading.Thread(target=_pump, args=(stream, lines), daemon=True).start()
        return process, out, err

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def _wait_for_line(lines: queue.Queue[str], text: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        if text in line:
            return line
    raise AssertionError(f"no line with {text!r} within {timeout} s; got {seen}")


def test_sigterm_stops_the_scheduler_command_with_exit_code_0(
    db: TestDatabase, scheduler_process: Any
) -> None:
    import json

    _declare(db, "consumer", "orders")
    (event,) = _register(db, "orders")
    process, out, err = scheduler_process("--poll-interval", "30", "--json")
    run = json.loads(_wait_for_line(out, '"dag_id"'))
    assert (run["dag_id"], run["event_ids"]) == ("consumer", [event.id])
    _wait_for_line(err, "started on namespace")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    _wait_for_line(err, "stopped after")


def test_the_scheduler_command_refuses_a_namespace_without_assetq(
    db: TestDatabase, scheduler_process: Any
) -> None:
    process, _, err = scheduler_process("--namespace", "aq_missing")
    assert process.wait(timeout=60) == 1
    _wait_for_line(err, "does not exist (or holds no assetq schema)")


def test_a_database_that_is_down_at_start_is_an_error_the_loop_backs_off_from(
    db: TestDatabase,
) -> None:
    url = db.url.set(host="127.0.0.1", port=1).difference_update_query(["unix_socket", "host"])
    engine = sa.create_engine(url)  # nothing listens on port 1
    try:
        stats = assetq.run_scheduler(engine, max_passes=2, backoff_initial=0.001)
    finally:
        engine.dispose()
    assert (stats.passes, stats.errors) == (2, 2)


@pytest.mark.engines("postgresql")
def test_a_producer_transaction_left_open_does_not_keep_notifications_from_waking_the_loop(
    db: TestDatabase,
) -> None:
    """A producer queues an event and leaves its transaction open: the scheduler cannot take
    the wake-up lock (it would wait for that transaction). Another producer commits, and a
    notification comes: the scheduler passes and consumes the committed event while the open
    transaction is still open, long before the 30 s poll. (The notification is sent by hand
    too: the second producer's own is certain only while the scheduler's request is queued,
    not in the instant between two of its attempts.)"""
    _declare(db, "consumer", "orders")
    with db.engine.connect() as open_producer:
        assetq.register_event(open_producer, "orders")  # never committed
        loop = _Loop(db, poll_interval=30)
        try:
            _until(lambda: _locks(db, WAKEUP, granted=False) == 1, "the scheduler to wait")
            (event,) = _register(db, "orders")
            with db.engine.begin() as conn:
                conn.exec_driver_sql(f'NOTIFY "{db.namespace}"')
            run = loop.runs.get(timeout=20)  # a hang here means the notification was ignored
        finally:
            stats = loop.finish()
            open_producer.rollback()
    assert run.event_ids == (event.id,)
    assert stats.wakeups >= 1


@pytest.mark.engines("postgresql")
def test_while_another_scheduler_waits_for_wake_ups_an_idle_one_is_woken_too(
    db: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """Another session holds the wake-up lock, as a scheduler waiting for notifications. An
    idle loop then queues no request for the lock (a queued request would time out every
    so often, each time an ERROR in the server's log, and would make producers' and other
    schedulers' checks fail) and waits for notifications too: the other's pass may skip a
    consumer this loop's pass holds. A producer commits: it notifies, this loop passes."""
    _declare(db, "consumer", "orders")
    with (
        psycopg.connect(_psycopg_url(db), autocommit=True) as other,
        caplog.at_level(logging.DEBUG, logger="assetq"),
    ):
        other.execute(db.dialect.query("wakeup_arm", db.namespace))
        loop = _Loop(db, poll_interval=30)
        try:
            _until(lambda: _logged(caplog, "another scheduler waits for wake-ups"), "the wait")
            assert _wakeup_lock(db, granted=False) == 0
            (event,) = _register(db, "orders")
            run = loop.runs.get(timeout=20)  # a hang here means no wake-up: the poll is 30 s
        finally:
            stats = loop.finish()
    assert run.event_ids == (event.id,)
    assert stats.wakeups >= 1
    assert stats.arms == 0  # the other session held the lock throughout


#: High half of the key of the lock a listening worker holds shared (workers_listen_mark).
WORKERS = 0x61737477


@contextlib.contextmanager
def _a_worker_listens(db: TestDatabase) -> Iterator[None]:
    """A session holding the workers' lock, as a listening worker's connection does."""
    with db.engine.connect() as conn:
        conn.execute(sa.text(db.dialect.query("workers_listen_mark", db.namespace)))
        conn.commit()
        assert _locks(db, WORKERS, granted=True, shared=True) == 1
        yield
        conn.invalidate()  # the session lock goes with the session


@pytest.mark.engines("postgresql")
def test_woken_by_producers_while_a_worker_listens_the_loop_gives_it_a_head_start(
    db: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """The loop, woken by a producer's commit while a worker listens, waits its head start
    before passing: the worker's claim with a pass, made meanwhile, makes and claims the run
    (Claim.made), and the loop's pass after it finds nothing. The head start is 10 s here and
    the loop is stopped during it: nothing depends on how fast anything is."""
    _declare(db, "report", "orders")
    caplog.set_level(logging.DEBUG, logger="assetq.scheduler")
    with _a_worker_listens(db):
        loop = _Loop(db, poll_interval=120, worker_head_start=10)
        _until(lambda: loop.passes >= 2 and _wakeup_lock(db, granted=True) == 1, "the wait")
        (event,) = _register(db, "orders")
        _until(lambda: _logged(caplog, "a head start of 10 s"), "the head start")
        (claim,) = assetq.claim_runs(db.engine, "w1", dag_ids=["report"], schedule=True)
        stats = loop.finish()
    assert claim.made and claim.event_ids == (event.id,)
    assert (stats.head_starts, stats.runs) == (1, 0)
    assert loop.runs.empty()


@pytest.mark.engines("postgresql")
def test_with_no_worker_listening_the_loop_passes_at_once(
    db: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """No worker listens: the wake-up is passed at once, with a head start of 10 s set."""
    _declare(db, "report", "orders")
    caplog.set_level(logging.DEBUG, logger="assetq.scheduler")
    loop = _Loop(db, poll_interval=120, worker_head_start=10)
    _until(lambda: loop.passes >= 2 and _wakeup_lock(db, granted=True) == 1, "the wait")
    (event,) = _register(db, "orders")
    run = loop.runs.get(timeout=60)
    stats = loop.finish()
    assert run.event_ids == (event.id,)
    assert stats.head_starts == 0 and not _logged(caplog, "a head start")


def test_a_head_start_out_of_range_is_refused(db: TestDatabase) -> None:
    for bad in (-0.1, 10.5, True, "1"):
        with pytest.raises(assetq.InvalidArgument, match="worker_head_start"):
            assetq.run_scheduler(db.engine, max_passes=1, worker_head_start=bad)  # type: ignore[arg-type]
