"""Retention (assetq.purge, `assetq purge`): history older than the cutoff goes, in small
batches; a queued event never does, however old; producers and schedulers never wait for it.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
import sqlalchemy as sa

import assetq
from dbs import TestDatabase

NOW = timedelta(0)


def _declare(db: TestDatabase, dag_id: str, condition: assetq.Condition) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, dag_id, condition)


def _register(db: TestDatabase, *assets: str) -> list[assetq.Event]:
    with db.engine.begin() as conn:
        return [assetq.register_event(conn, a) for a in assets]


def _schedule(db: TestDatabase) -> list[assetq.Run]:
    """One pass, whose runs then succeed: purge deletes finished runs only."""
    runs = assetq.schedule(db.engine)
    with db.engine.begin() as conn:
        for run in runs:
            assetq.set_run_state(conn, run.dag_id, run.run_id, "success")
    return runs


def _count(db: TestDatabase, table: str) -> int:
    return int(db.scalar(f"SELECT count(*) FROM {{ns}}.{table}"))


def _age(db: TestDatabase, table: str, column: str, hours: int) -> None:
    """Make every row of ``table`` ``hours`` older. INTERVAL 'n' HOUR reads the same on both
    engines."""
    column = f"{db.dialect.quote}{column}{db.dialect.quote}"  # "timestamp" is a keyword
    db.execute(f"UPDATE {{ns}}.{table} SET {column} = {column} - INTERVAL '{hours}' HOUR")


def test_purge_deletes_runs_links_and_consumed_events_before_the_cutoff(db: TestDatabase) -> None:
    _declare(db, "report", "orders")
    _register(db, "orders", "orders")
    (run,) = _schedule(db)
    result = assetq.purge(db.engine, older_than=NOW)
    assert (result.runs_deleted, result.events_deleted, result.events_examined) == (1, 2, 2)
    for table in ("dag_run", "dagrun_asset_event", "asset_event", "asset_dag_run_queue"):
        assert _count(db, table) == 0, table
    assert (_count(db, "dag"), _count(db, "asset")) == (1, 1)
    with db.engine.connect() as conn:
        (report,) = assetq.status(conn)
    assert report.runs_total == 1  # the run sequence survives its runs
    _register(db, "orders")
    (later,) = _schedule(db)
    assert later.seq == run.seq + 1


def test_purge_keeps_everything_newer_than_the_cutoff(db: TestDatabase) -> None:
    _declare(db, "report", "orders")
    _register(db, "orders")
    _schedule(db)
    before = db.counts()
    result = assetq.purge(db.engine, older_than=timedelta(days=1))
    assert (result.runs_deleted, result.events_deleted, result.events_examined) == (0, 0, 0)
    assert db.counts() == before


def test_purge_never_deletes_a_queued_event_however_old(db: TestDatabase) -> None:
    _declare(db, "sales", assetq.all_of("orders", "payments"))
    _declare(db, "idle", "orders")
    with db.engine.begin() as conn:
        assetq.pause_dag(conn, "idle")
    (waiting,) = _register(db, "orders")  # sales waits for payments
    _age(db, "asset_event", "timestamp", 48)
    result = assetq.purge(db.engine, older_than=timedelta(hours=1))
    assert (result.events_deleted, result.events_examined) == (0, 1)
    assert _count(db, "asset_event") == 1
    (payment,) = _register(db, "payments")
    (run,) = _schedule(db)
    assert run.event_ids == (waiting.id, payment.id)


def test_a_queued_event_is_kept_however_old_without_a_foreign_key_behind_the_test(
    db: TestDatabase,
) -> None:
    """What purge relies on since 0013_queue_checks: its own "still queued?" test, with no
    foreign key behind it (the queue's key to asset_event, which refused even a raw DELETE of
    a queued event, is gone). An event queued for one consumer and consumed by the other is
    kept, however far past the cutoff, until its last queue row is consumed; then it goes."""
    _declare(db, "report", "orders")
    _declare(db, "audit", "orders")
    inspector = sa.inspect(db.engine)
    assert inspector.get_foreign_keys("asset_dag_run_queue", schema=db.namespace) == []
    (event,) = _register(db, "orders")
    with db.engine.begin() as conn:
        assetq.pause_dag(conn, "audit")
    _schedule(db)  # report consumes it, audit still waits
    _age(db, "asset_event", "timestamp", 480)
    _age(db, "asset_dag_run_queue", "created_at", 480)
    _age(db, "dag_run", "created_at", 480)
    result = assetq.purge(db.engine, older_than=timedelta(hours=1))
    assert (result.runs_deleted, result.events_deleted) == (1, 0)
    assert _count(db, "asset_event") == 1
    assert db.scalar("SELECT target_dag_id FROM {ns}.asset_dag_run_queue") == "audit"
    with db.engine.begin() as conn:
        assetq.unpause_dag(conn, "audit")
    _schedule(db)
    _age(db, "dag_run", "created_at", 480)
    result = assetq.purge(db.engine, older_than=timedelta(hours=1))
    assert (result.runs_deleted, result.events_deleted) == (1, 1)
    assert (_count(db, "asset_event"), _count(db, "asset_dag_run_queue")) == (0, 0)
    assert event.id not in [e for _, e in db.links()]


def test_an_old_event_consumed_by_a_kept_run_is_kept_with_its_link(db: TestDatabase) -> None:
    """Events go only when no kept run links them: a run newer than the cutoff keeps the
    record of everything it consumed, however old."""
    _declare(db, "report", "orders")
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, "nobody_reads_this")
    old_event, _ = _register(db, "orders", "nobody_reads_this")
    _age(db, "asset_event", "timestamp", 48)
    _age(db, "asset_dag_run_queue", "created_at", 48)
    _schedule(db)  # a new run consuming a two-day-old event
    result = assetq.purge(db.engine, older_than=timedelta(hours=1))
    assert (result.runs_deleted, result.events_deleted) == (0, 1)  # the unread one only
    assert db.links() == [("report", old_event.id)]
    _age(db, "dag_run", "created_at", 48)
    result = assetq.purge(db.engine, older_than=timedelta(hours=1))
    assert (result.runs_deleted, result.events_deleted) == (1, 1)
    assert (_count(db, "asset_event"), db.links()) == (0, [])


def test_batches_walk_past_kept_events_instead_of_examining_them_again(db: TestDatabase) -> None:
    _declare(db, "report", "orders")
    _declare(db, "sales", assetq.all_of("refunds", "payments"))
    with db.engine.begin() as conn:
        for _ in range(25):
            assetq.register_event(conn, "orders")
            assetq.register_event(conn, "refunds")  # stays queued for sales
    _schedule(db)
    result = assetq.purge(db.engine, older_than=NOW, batch_size=7)
    assert (result.runs_deleted, result.events_deleted, result.events_examined) == (1, 25, 50)
    # 1 run batch + 1 empty; 50 events in batches of 7: 8 batches (the last short).
    assert result.batches == 2 + 8
    assert _count(db, "asset_dag_run_queue") == 25


def test_purge_never_waits_for_an_open_producer_or_scheduler_transaction(
    db: TestDatabase,
) -> None:
    _declare(db, "report", "orders")
    _register(db, "orders", "orders")
    _schedule(db)  # history to purge
    (pending,) = _register(db, "orders")
    result: list[assetq.PurgeResult] = []
    with db.engine.connect() as producer, db.engine.connect() as scheduler:
        producer.begin()
        late = assetq.register_event(producer, "orders")  # uncommitted, its rows locked
        scheduler.begin()
        dialect = db.dialect
        dialect.execute(scheduler, "scheduler_transaction", db.namespace)
        assert len(dialect.execute(scheduler, "schedule_pass", db.namespace, {"limit": 10})) == 1
        # The pass holds the consumer, its new run and links, and the claimed queue row.
        worker = threading.Thread(
            target=lambda: result.append(assetq.purge(db.engine, older_than=NOW)), daemon=True
        )
        worker.start()
        worker.join(timeout=30)
        assert not worker.is_alive(), "purge waited for an open producer or scheduler"
        scheduler.commit()
        producer.commit()
    assert (result[0].runs_deleted, result[0].events_deleted) == (1, 2)
    (run,) = _schedule(db)
    assert run.event_ids == (late.id,)
    assert db.links() == sorted([("report", pending.id), ("report", late.id)])


#: What every session of the test database is doing, for a failure message: which one waits,
#: for what, running which statement.
SESSIONS = {
    "postgresql": "SELECT pid, state, wait_event_type, wait_event, left(query, 200)"
    " FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
    "mysql": "SELECT trx_mysql_thread_id, trx_state, trx_isolation_level,"
    " left(trx_query, 200), trx_rows_locked FROM information_schema.INNODB_TRX",
}


def test_an_open_purge_batch_never_holds_back_producers_or_schedulers(db: TestDatabase) -> None:
    """A batch of each step is left open, its rows locked and deleted but not committed;
    meanwhile a producer commits a new event and a scheduler pass consumes it."""
    _declare(db, "report", "orders")
    _register(db, "orders", "orders")
    _schedule(db)
    _register(db, "orders")
    _schedule(db)  # two runs: one to purge in the open batch, one after
    dialect = db.dialect
    done: list[str] = []

    def produce_and_schedule() -> None:
        (event,) = _register(db, "orders")
        done.append("registered")
        (run,) = _schedule(db)
        assert run.event_ids == (event.id,)
        done.append("scheduled")

    with db.engine.connect() as purger:
        purger.begin()
        dialect.execute(purger, "scheduler_transaction", db.namespace)
        (cutoff,) = dialect.execute(purger, "purge_cutoff", db.namespace, {"seconds": 0})[0]
        batch = {"older_than": cutoff, "batch_size": 1}
        assert dialect.execute(purger, "purge_runs", db.namespace, batch)[0].deleted == 1
        batch.update(after_timestamp=None, after_id=None)
        assert dialect.execute(purger, "purge_events", db.namespace, batch)[0].deleted == 1
        worker = threading.Thread(target=produce_and_schedule, daemon=True)
        worker.start()
        worker.join(timeout=60)
        if worker.is_alive():  # what waits for what, while the batch is still open
            sessions = [tuple(r) for r in db.rows(SESSIONS[db.engine_name])]
            pytest.fail(f"waited for the purge batch; done before: {done}; sessions: {sessions}")
        purger.commit()
    assert done == ["registered", "scheduled"]


def test_under_load_purge_loses_nothing_queued_and_exactly_once_holds(db: TestDatabase) -> None:
    """Producers (some committing late, some rolling back) and a scheduler loop run while
    purge deletes everything consumed, again and again. The scheduler's own record of what
    it delivered (the database's is being purged) shows every committed event reached each
    consumer exactly once."""
    consumers = ("first", "second")
    for dag_id in consumers:
        _declare(db, dag_id, "orders")
    engine = db.new_engine(pool_size=8)
    committed: list[int] = []
    rolled_back: list[int] = []
    delivered: dict[str, Counter[int]] = {c: Counter() for c in consumers}
    lock = threading.Lock()
    failures: list[BaseException] = []
    stop = threading.Event()

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(120):
                with engine.connect() as conn:
                    event = assetq.register_event(conn, "orders")
                    time.sleep(rng.uniform(0, 0.003))  # a late commit
                    if rng.random() < 0.1:
                        conn.rollback()
                        with lock:
                            rolled_back.append(event.id)
                    else:
                        conn.commit()
                        with lock:
                            committed.append(event.id)
        except BaseException as exc:
            failures.append(exc)

    def on_run(run: assetq.Run) -> None:
        with lock:
            delivered[run.dag_id].update(run.event_ids)
        with engine.begin() as conn:  # finished runs are purged with their links
            assetq.set_run_state(conn, run.dag_id, run.run_id, "success")

    def schedule() -> None:
        try:
            assetq.run_scheduler(
                engine, stop_event=stop, on_run=on_run, poll_interval=0.01, listen=False
            )
        except BaseException as exc:
            failures.append(exc)

    producers = [threading.Thread(target=produce, args=(seed,)) for seed in (1, 2)]
    scheduler = threading.Thread(target=schedule)
    for thread in (*producers, scheduler):
        thread.start()
    purges = deleted = 0
    while any(p.is_alive() for p in producers) and not failures:
        deleted += assetq.purge(engine, older_than=NOW, batch_size=25).events_deleted
        purges += 1
    for p in producers:
        p.join(timeout=120)
    deadline = time.monotonic() + 120
    while _count(db, "asset_dag_run_queue") and time.monotonic() < deadline and not failures:
        time.sleep(0.05)
    stop.set()
    scheduler.join(timeout=120)
    assert failures == []
    assert _count(db, "asset_dag_run_queue") == 0
    deleted += assetq.purge(engine, older_than=NOW).events_deleted

    assert purges > 1 and deleted == len(committed)
    for dag_id in consumers:
        assert sorted(delivered[dag_id]) == sorted(committed), dag_id
        assert set(delivered[dag_id].values()) == {1}, f"{dag_id}: an event delivered twice"
    assert not set(rolled_back) & set(delivered["first"])
    assert (_count(db, "asset_event"), _count(db, "dag_run")) == (0, 0)


def test_purge_never_deletes_a_queued_or_running_run_however_old(db: TestDatabase) -> None:
    """A long run's worker must still find its run: only finished runs are purged, with the
    events they alone linked."""
    _declare(db, "report", "orders")
    _register(db, "orders")
    (queued,) = assetq.schedule(db.engine)
    _register(db, "orders")
    (running,) = assetq.schedule(db.engine)
    (claim,) = assetq.claim_runs(db.engine, "w1", dag_ids=["report"], limit=1)
    assert claim.run_id == queued.run_id
    _register(db, "orders")
    (finished,) = _schedule(db)
    _age(db, "dag_run", "created_at", 48)
    result = assetq.purge(db.engine, older_than=timedelta(hours=1))
    assert result.runs_deleted == 1
    with db.engine.connect() as conn:
        left = {r.run_id: r.state for r in assetq.runs(conn, "report")}
    assert left == {queued.run_id: "running", running.run_id: "queued"}
    assert finished.run_id not in left
    assert _count(db, "dagrun_asset_event") == 2


def test_purge_refuses_bad_arguments(db: TestDatabase) -> None:
    with pytest.raises(assetq.InvalidArgumentType):
        assetq.purge(db.engine, older_than=3600)  # type: ignore[arg-type]
    with pytest.raises(assetq.InvalidArgument):
        assetq.purge(db.engine, older_than=timedelta(seconds=-1))
    with pytest.raises(assetq.InvalidArgument):
        assetq.purge(db.engine, older_than=NOW, batch_size=0)


def test_purge_command(db: TestDatabase) -> None:
    _declare(db, "report", "orders")
    _register(db, "orders")
    _schedule(db)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASSETQ_")}
    env["ASSETQ_DATABASE_URL"] = db.url.render_as_string(hide_password=False)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "assetq", "purge", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

    kept = run("--older-than", "1d")
    assert kept.returncode == 0, kept.stderr
    assert "purged 0 runs and 0 events" in kept.stdout
    done = run("--older-than", "0s", "--json", "--batch-size", "10")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["runs_deleted"], data["events_deleted"]) == (1, 1)
    assert run().returncode == 2  # --older-than is required
    bad = run("--older-than", "ten days")
    assert bad.returncode == 2 and "not a duration" in bad.stderr


def test_purge_never_deletes_a_live_processs_liveness_row_whatever_the_cutoff(
    db: TestDatabase,
) -> None:
    """Issue 26: `assetq purge --older-than 0s` deleted the rows of running schedulers and
    workers (last seen a moment before the cutoff), and status showed none until their next
    heartbeat. A row goes only once stale: not seen for STALE_INTERVALS of its interval."""
    from assetq import cli, liveness

    alive = liveness.Liveness(db.engine, db.namespace, "worker", 30.0, name="alive")
    dead = liveness.Liveness(db.engine, db.namespace, "scheduler", 0.05)
    assert alive.beat() and dead.beat()
    # dead is stale now, alive is not; both were last seen before the cutoff of 0s (now).
    time.sleep(0.05 * liveness.STALE_INTERVALS + 0.2)
    preview = assetq.purge_preview(db.engine, older_than=NOW, namespace=db.namespace)
    assert preview.processes == 1
    url = db.url.render_as_string(hide_password=False)
    argv = ["--url", url, "--namespace", db.namespace, "purge", "--older-than", "0s", "--json"]
    assert cli.main(argv) == cli.EXIT_OK
    assert db.rows("SELECT kind, name FROM {ns}.process_liveness") == [("worker", "alive")]
    # Again through the API; and the kept row is its live self for status.
    assert assetq.purge(db.engine, older_than=NOW, namespace=db.namespace).processes_deleted == 0
    with db.engine.connect() as conn:
        (shown,) = assetq.processes(conn, namespace=db.namespace)
    assert (shown.name, shown.stale) == ("alive", False)
    alive.gone()
