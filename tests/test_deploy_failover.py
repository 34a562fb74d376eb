"""Failover: connection loss is a TransientError (ConnectionLost) everywhere, also at connect
time; the scheduler and the worker start against a database that is down and wait for it; a
read-only server (a standby) is reported once, clearly, by the loops and by doctor; producers
with idempotency keys and a scheduler run through a `kill -9` of a primary and the promotion
of its synchronous standby, reached through a libpq multi-host URL with
target_session_attrs=read-write, and no acknowledged event is lost.

Servers: a TCP forwarder to the suite's PostgreSQL plays a database that is down and comes
back; tests/servers.py starts a throw-away primary and a pg_basebackup standby from Debian's
PostgreSQL binaries. The failover test's sizes are small in the default suite; the slow one
(`-m slow`) runs thousands of events. Nothing here depends on timing: loops are bounded, the
kill comes after a number of acknowledged events, waits only catch hangs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Connection, Engine

import assetq
from assetq import cli
from dbs import TestDatabase
from servers import ReplicatedPostgres, TcpForwarder, free_port, start_replicated_postgres

#: URLs where nothing listens: a database that is down.
DOWN = {
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:{port}/x?connect_timeout=2",
    "mysql": "mysql+pymysql://root@127.0.0.1:{port}/x?connect_timeout=2",
}


@pytest.mark.parametrize("engine_kind", sorted(DOWN))
def test_engine_calls_raise_connection_lost_when_the_server_is_down(engine_kind: str) -> None:
    """Raised at connect time, outside any transaction: a TransientError, not SQLAlchemy's
    OperationalError, for every call that takes an engine."""
    engine = sa.create_engine(DOWN[engine_kind].format(port=free_port()))
    calls = {
        "schedule": lambda: assetq.schedule(engine, max_attempts=2),
        "purge": lambda: assetq.purge(engine, older_than=timedelta(days=1), max_attempts=2),
        "claim_runs": lambda: assetq.claim_runs(engine, "w", max_attempts=2),
        "doctor": lambda: assetq.doctor(engine),
    }
    try:
        for name, call in calls.items():
            with pytest.raises(assetq.ConnectionLost) as caught:
                call()
            assert isinstance(caught.value, assetq.TransientError), name
    finally:
        engine.dispose()


@pytest.fixture
def down_then_up(db: TestDatabase) -> Iterator[tuple[TcpForwarder, str]]:
    """A URL of the test database on a port where nothing listens until the forwarder is
    started (PostgreSQL: the suite's MySQL servers listen on unix sockets only). The server
    may listen on a unix socket only too (the embedded one): the forwarder reaches it there,
    and the URL loses its socket directory."""
    backend: Any = db.backend
    forwarder = TcpForwarder(backend.host, backend.port)
    url = db.url.difference_update_query(["host"]).set(host="127.0.0.1", port=forwarder.port)
    try:
        yield forwarder, url.render_as_string(hide_password=False)
    finally:
        forwarder.stop()


class _Seen(logging.Handler):
    """Sets ``event`` when a record containing ``text`` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


def _watch(text: str) -> _Seen:
    seen = _Seen(text)
    logging.getLogger("assetq").addHandler(seen)
    return seen


@pytest.mark.engines("postgresql")
def test_the_scheduler_command_waits_for_a_database_that_is_down_at_start(
    db: TestDatabase, down_then_up: tuple[TcpForwarder, str]
) -> None:
    forwarder, url = down_then_up
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
        assetq.register_event(conn, "orders")
    seen = _watch("cannot be reached yet")
    codes: list[int] = []
    argv = ["--url", url, "scheduler", "--max-passes", "2", "--poll-interval", "0.1"]
    thread = threading.Thread(target=lambda: codes.append(cli.main(argv)), daemon=True)
    try:
        thread.start()
        assert seen.event.wait(60), "the scheduler did not say it waits"
        assert thread.is_alive()  # waiting, not exited
        forwarder.start()
        thread.join(timeout=120)
    finally:
        logging.getLogger("assetq").removeHandler(seen)
    assert codes == [0]
    assert len(db.links()) == 1


@pytest.mark.engines("postgresql")
def test_the_worker_loop_started_while_the_database_is_down_does_its_run_once_it_is_up(
    db: TestDatabase, down_then_up: tuple[TcpForwarder, str]
) -> None:
    forwarder, url = down_then_up
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
        assetq.register_event(conn, "orders")
    assert len(assetq.schedule(db.engine)) == 1
    engine = sa.create_engine(url)
    seen = _watch("claim failed")
    done: list[assetq.WorkerStats] = []

    def handler(claim: assetq.Claim, conn: Connection) -> None:
        return None

    thread = threading.Thread(
        target=lambda: done.append(
            assetq.run_worker(engine, {"report": handler}, max_runs=1, backoff_max=0.5)
        ),
        daemon=True,
    )
    try:
        thread.start()
        assert seen.event.wait(60), "the worker did not try"
        forwarder.start()
        thread.join(timeout=120)
    finally:
        logging.getLogger("assetq").removeHandler(seen)
        engine.dispose()
    assert [s.succeeded for s in done] == [1]


@pytest.fixture
def read_only_db(db: TestDatabase) -> TestDatabase:
    """The test database with every new session read-only, as on a standby (PostgreSQL:
    SQLSTATE 25006 for every write)."""
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
        assetq.register_event(conn, "orders")
    db.execute(f"ALTER DATABASE {db.name} SET default_transaction_read_only = on")
    db.engine.dispose()
    return db


@pytest.mark.engines("postgresql")
def test_a_read_only_server_is_a_read_only_error_that_says_where_to_point(
    read_only_db: TestDatabase,
) -> None:
    with pytest.raises(assetq.ReadOnlyServer) as caught:
        assetq.schedule(read_only_db.engine, max_attempts=1)
    assert caught.value.code == "25006"
    assert "target_session_attrs=read-write" in str(caught.value)


@pytest.mark.engines("postgresql")
def test_the_scheduler_reports_a_read_only_server_once(
    read_only_db: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="assetq"):
        stats = assetq.run_scheduler(
            read_only_db.engine, max_passes=3, backoff_initial=0.01, backoff_max=0.02
        )
    assert stats.errors == 3
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    (record,) = errors
    assert "ReadOnlyServer" in record.getMessage() and "25006" in record.getMessage()
    assert "read-only" in record.getMessage()


@pytest.mark.engines("postgresql")
def test_doctor_reports_a_read_only_server(read_only_db: TestDatabase) -> None:
    report = assetq.doctor(read_only_db.engine)
    assert not report.ok
    (check,) = [c for c in report.checks if c.name == "read-only"]
    assert check.severity == "problem" and "default_transaction_read_only" in check.fix


# -- a primary killed, its synchronous standby promoted --------------------------------------


@pytest.fixture
def replicated(pytestconfig: pytest.Config) -> Iterator[ReplicatedPostgres]:
    """A synchronous pair from this machine's PostgreSQL binaries, whatever server the suite
    runs on: left out of runs on the embedded server (CI's second pass) and of runs
    without PostgreSQL."""
    if str(pytestconfig.getoption("--postgres")) == "embedded":
        pytest.skip("the pair is made from this machine's binaries: tested in the main run")
    if "postgresql" not in str(pytestconfig.getoption("--engines")):
        pytest.skip("PostgreSQL is not among the engines of this run (--engines)")
    pair = start_replicated_postgres(synchronous=True)
    try:
        admin = sa.create_engine(pair.primary.url(), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text("CREATE DATABASE app"))
        admin.dispose()
        engine = sa.create_engine(pair.primary.url("app"))
        assetq.install(engine)
        with engine.begin() as conn:
            assetq.declare_dag(conn, "report", "orders")
        engine.dispose()
        pair.wait_replayed()
        yield pair
    finally:
        pair.stop()


def _standby_refuses_writes_and_doctor_says_so(pair: ReplicatedPostgres) -> None:
    standby = sa.create_engine(pair.standby.url("app"))
    try:
        with pytest.raises(assetq.ReadOnlyServer):
            assetq.schedule(standby, max_attempts=1)
        report = assetq.doctor(standby)
    finally:
        standby.dispose()
    (check,) = [c for c in report.checks if c.name == "read-only"]
    assert check.severity == "problem" and "standby" in check.detail
    assert "target_session_attrs=read-write" in check.fix


def _produce(
    engine: Engine, keys: list[str], acked: dict[str, int], lock: threading.Lock, give_up: float
) -> None:
    """The documented producer recipe: each event in its own transaction, retried with the
    same idempotency key on a transient error or a lost connection (at connect, during the
    call or at COMMIT), so a retry never makes a second event. A key counts as acknowledged
    once its COMMIT returned."""
    for key in keys:
        while True:
            try:
                with engine.begin() as conn:
                    event = assetq.register_event(conn, "orders", idempotency_key=key)
                break
            except (assetq.TransientError, sa.exc.OperationalError, sa.exc.InterfaceError):
                if time.monotonic() > give_up:
                    raise
                time.sleep(0.05)
        with lock:
            acked[key] = event.id


def _failover_under_load(pair: ReplicatedPostgres, producers: int, per_producer: int) -> None:
    engine = sa.create_engine(pair.multi_host_url("app"), pool_size=producers + 2)
    acked: dict[str, int] = {}
    lock = threading.Lock()
    give_up = time.monotonic() + 300
    failures: list[BaseException] = []

    def producer(n: int) -> None:
        try:
            keys = [f"p{n}-{i}" for i in range(per_producer)]
            _produce(engine, keys, acked, lock, give_up)
        except BaseException as exc:
            failures.append(exc)

    stop = threading.Event()
    stats: list[assetq.SchedulerStats] = []
    scheduler = threading.Thread(
        target=lambda: stats.append(
            assetq.run_scheduler(engine, poll_interval=0.2, backoff_max=0.5, stop_event=stop)
        ),
        daemon=True,
    )
    threads = [threading.Thread(target=producer, args=(n,), daemon=True) for n in range(producers)]
    try:
        scheduler.start()
        for thread in threads:
            thread.start()
        total = producers * per_producer
        deadline = time.monotonic() + 120
        while len(acked) < total // 3 and time.monotonic() < deadline and not failures:
            time.sleep(0.01)
        before_kill = len(acked)
        pair.primary.crash()
        pair.promote()
        for thread in threads:
            thread.join(timeout=300)  # catches a hang only
        assert [t.is_alive() for t in threads] == [False] * producers
        assert failures == []
        assert before_kill < total  # the kill came while producers were producing
    finally:
        stop.set()
        scheduler.join(timeout=60)  # catches a hang only
    try:
        assert len(stats) == 1  # the loop ran through the failover and stopped when told
        # Drain what the loop left queued through the same URL (the new primary), only now
        # that the loop has stopped: a pass of its own still in flight holds the consumer,
        # the drain's pass skips it (SKIP LOCKED) and returns no run, and the loop's pass
        # may have read the queue before the last producer's commit.
        for _ in range(1000):
            if not assetq.schedule(engine):
                break
    finally:
        engine.dispose()

    promoted = sa.create_engine(pair.standby.url("app"))
    try:
        with promoted.connect() as conn:
            events = dict(
                conn.execute(sa.text("SELECT idempotency_key, id FROM assetq.asset_event")).all()
            )
            links = conn.execute(
                sa.text("SELECT dag_id, asset_event_id FROM assetq.dagrun_asset_event")
            ).all()
            queued = conn.execute(
                sa.text("SELECT count(*) FROM assetq.asset_dag_run_queue")
            ).scalar_one()
    finally:
        promoted.dispose()
    assert len(acked) == producers * per_producer
    lost = {k: v for k, v in acked.items() if events.get(k) != v}
    assert lost == {}, f"{len(lost)} acknowledged events lost or changed"
    assert len(events) == len(acked)  # one event per key: retries made no second one
    assert sorted(e for _, e in links) == sorted(events.values())  # each consumed once
    assert queued == 0


def test_a_standby_refuses_passes_until_promoted_and_then_has_every_acknowledged_event(
    replicated: ReplicatedPostgres,
) -> None:
    """One pair for both (a pair takes seconds to make): before the failover the standby
    refuses writes, which passes and doctor say clearly; after a kill -9 of the primary and
    the promotion, the multi-host URL reaches it and nothing acknowledged is missing."""
    _standby_refuses_writes_and_doctor_says_so(replicated)
    _failover_under_load(replicated, producers=2, per_producer=60)


@pytest.mark.slow
def test_a_promoted_synchronous_standby_has_every_acknowledged_event_under_long_load(
    replicated: ReplicatedPostgres,
) -> None:
    _failover_under_load(replicated, producers=4, per_producer=1500)
