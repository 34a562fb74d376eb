"""assetq behind PgBouncer (tests/servers.py starts one in front of the suite's PostgreSQL).

Transaction pooling lends a server connection to another client after every transaction.
Producers, passes, workers and the command line work through it with psycopg's server-side
prepares off (engines assetq builds turn them off; a user's engine that does not gets
PreparedStatementConflict, which names the setting). The listening connections of the
scheduler and the worker notice that they do not hold one server session and poll, leaving
no LISTEN, advisory lock or setting on a server connection other clients get (I11), which is
checked from other clients of the same pooler; a direct listen engine gives the wake-ups
back. Session pooling keeps one server session per client: the scheduler listens through
it, and what it set is gone for the next client (PgBouncer's DISCARD ALL).

Deterministic: PgBouncer has at most two server connections (pool_size), so later clients
get the very connections the scheduler used; loops are bounded by max_passes / max_runs or
stopped by their callbacks, and waits have timeouts that only catch a hang.
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
from sqlalchemy.engine import URL

import assetq
from assetq import cli
from assetq.dialects import engine_arguments
from dbs import TestDatabase
from servers import PgBouncer, start_pgbouncer

pytestmark = pytest.mark.engines("postgresql")

#: Session defaults of the test database that the scheduler's listening session would change
#: (statement_timeout 0, lock_timeout 250ms/2s): a leak shows as another value.
DEFAULTS = {"statement_timeout": "17s", "lock_timeout": "13s"}

POOLED = "does not hold one server session"


def _engine(url: URL, **kwargs: Any) -> Engine:
    """An engine as assetq's command line builds it (server-side prepares off)."""
    url, connect_args = engine_arguments(url)
    return sa.create_engine(url, connect_args=connect_args, **kwargs)


@pytest.fixture
def pooled_db(db: TestDatabase) -> TestDatabase:
    """The test database with session defaults a leak would change, and a consumer."""
    for name, value in DEFAULTS.items():
        db.execute(f"ALTER DATABASE {db.name} SET {name} = '{value}'")
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
    db.engine.dispose()  # its pooled sessions predate the defaults
    return db


@pytest.fixture
def bouncer(db: TestDatabase, request: pytest.FixtureRequest) -> Iterator[PgBouncer]:
    """PgBouncer in front of the test's server: transaction pooling, two server connections
    (indirect parametrization: ("session", 2), ("transaction", 1)...)."""
    mode, size = getattr(request, "param", ("transaction", 2))
    backend: Any = db.backend
    started = start_pgbouncer(backend.host, backend.port, pool_mode=mode, pool_size=size)
    try:
        yield started
    finally:
        started.stop()


def _session_state(bouncer: PgBouncer, dbname: str, clients: int = 6) -> list[dict[str, Any]]:
    """What ``clients`` new clients of the pooler find on the server connection they get:
    its advisory locks, its LISTEN channels and its settings (each its own connection, so
    that the pooler hands out whichever server connection is free)."""
    engine = sa.create_engine(
        bouncer.url(dbname), poolclass=sa.NullPool, connect_args={"prepare_threshold": None}
    )
    found = []
    try:
        for _ in range(clients):
            with engine.connect() as conn:
                row = conn.execute(
                    sa.text(
                        "SELECT pg_backend_pid() AS pid,"
                        " current_setting('statement_timeout') AS statement_timeout,"
                        " current_setting('lock_timeout') AS lock_timeout,"
                        " (SELECT count(*) FROM pg_listening_channels()) AS listening,"
                        " (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                        "   AND pid = pg_backend_pid()) AS advisory_locks"
                    )
                ).one()
                found.append(dict(row._mapping))
    finally:
        engine.dispose()
    return found


def _advisory_locks_in(db: TestDatabase) -> int:
    """Advisory locks anybody holds in the test database (read directly, not pooled)."""
    return int(
        db.scalar(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
    )


def _assert_clean(states: list[dict[str, Any]]) -> None:
    for state in states:
        assert state["listening"] == 0, state
        assert state["advisory_locks"] == 0, state
        assert state["statement_timeout"] == DEFAULTS["statement_timeout"], state
        assert state["lock_timeout"] == DEFAULTS["lock_timeout"], state


def _register(engine: Engine, n: int, prefix: str) -> list[int]:
    ids = []
    for i in range(n):
        with engine.begin() as conn:
            ids.append(assetq.register_event(conn, "orders", idempotency_key=f"{prefix}-{i}").id)
    return ids


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


def test_producers_and_passes_work_through_transaction_pooling_without_prepares(
    pooled_db: TestDatabase, bouncer: PgBouncer
) -> None:
    """4 producers x 25 transactions (a statement runs far more than the 5 times after which
    psycopg would prepare it) and a scheduler, all through the pooler: no error, every
    event consumed exactly once."""
    engine = _engine(bouncer.url(pooled_db.name), pool_size=5)
    failures: list[BaseException] = []
    produced: list[int] = []
    lock = threading.Lock()

    def producer(n: int) -> None:
        try:
            ids = _register(engine, 25, f"p{n}")
            with lock:
                produced.extend(ids)
        except BaseException as exc:
            failures.append(exc)

    try:
        threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            assetq.schedule(engine)
        for thread in threads:
            thread.join()
        while assetq.schedule(engine):
            pass
    finally:
        engine.dispose()
    assert failures == []
    assert len(produced) == 100
    assert pooled_db.links() == sorted(("report", i) for i in produced)


@pytest.mark.parametrize("bouncer", [("transaction", 1)], indirect=True)
def test_a_prepared_statement_collision_names_the_setting_that_avoids_it(
    pooled_db: TestDatabase, bouncer: PgBouncer
) -> None:
    """psycopg's default (prepare after 5 executions) through transaction pooling: two
    clients take turns on the one server connection, and the second one's prepare collides
    with the first one's. assetq says what to set, and the code is the server's."""
    engine = sa.create_engine(bouncer.url(pooled_db.name), poolclass=sa.NullPool)
    try:
        with (
            engine.connect() as first,
            engine.connect() as second,
            pytest.raises(assetq.PreparedStatementConflict) as caught,
        ):
            for i in range(10):
                for conn in (first, second):
                    with conn.begin():
                        assetq.register_event(conn, "orders", idempotency_key=f"k{i}")
    finally:
        engine.dispose()
    assert caught.value.code in {"42P05", "26000", "08P01"}
    assert 'connect_args={"prepare_threshold": None}' in str(caught.value)
    assert "?prepare_threshold=none" in str(caught.value)


def test_the_scheduler_through_transaction_pooling_polls_and_leaves_no_session_state(
    pooled_db: TestDatabase, bouncer: PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    engine = _engine(bouncer.url(pooled_db.name))
    _register(engine, 3, "before")
    during: list[list[dict[str, Any]]] = []
    locks_during: list[int] = []

    def on_pass(runs: list[assetq.Run]) -> None:
        if not during:  # while the loop is alive, after its listener's first attempt
            during.append(_session_state(bouncer, pooled_db.name))
            locks_during.append(_advisory_locks_in(pooled_db))

    try:
        with caplog.at_level(logging.WARNING, logger="assetq"):
            stats = assetq.run_scheduler(engine, poll_interval=0.05, max_passes=4, on_pass=on_pass)
    finally:
        engine.dispose()
    assert locks_during == [0]
    _assert_clean(during[0])
    _assert_clean(_session_state(bouncer, pooled_db.name))
    assert _advisory_locks_in(pooled_db) == 0
    (warning,) = _warnings(caplog, POOLED)
    assert "--listen-url" in warning.getMessage()
    assert stats.runs == 1 and stats.events == 3 and stats.errors == 0
    assert stats.wakeups == 0 and stats.arms == 0  # it polled


def test_the_worker_through_transaction_pooling_polls_and_leaves_no_listen_behind(
    pooled_db: TestDatabase, bouncer: PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    engine = _engine(bouncer.url(pooled_db.name))
    _register(engine, 1, "w")
    assert len(assetq.schedule(engine)) == 1
    warned = threading.Event()

    class Flag(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if POOLED in record.getMessage():
                warned.set()

    seen: list[list[dict[str, Any]]] = []

    def handler(claim: assetq.Claim, conn: Connection) -> None:
        # (Nothing sent on conn yet: it holds no server connection of the pooler.)
        warned.wait(20)  # the listener looked at its session (asserted below)
        seen.append(_session_state(bouncer, pooled_db.name))

    flag = Flag()
    logging.getLogger("assetq").addHandler(flag)
    try:
        with caplog.at_level(logging.WARNING, logger="assetq"):
            stats = assetq.run_worker(
                engine, {"report": handler}, max_runs=1, lease=timedelta(seconds=60)
            )
    finally:
        logging.getLogger("assetq").removeHandler(flag)
        engine.dispose()
    _assert_clean(seen[0])
    _assert_clean(_session_state(bouncer, pooled_db.name))
    assert len(_warnings(caplog, POOLED)) == 1
    assert stats.succeeded == 1


def _producer_when_armed(db: TestDatabase, engine: Engine) -> threading.Thread:
    """A thread that registers one event as soon as a scheduler holds the wake-up lock
    (waiting for notifications), at most 60 s."""

    def produce() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            held = db.scalar(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND classid = 1634956401 AND mode = 'ExclusiveLock'"
                " AND objid = CAST(CAST('{ns}.asset_dag_run_queue' AS regclass) AS oid)"
            )
            if held:
                _register(engine, 1, "woken")
                return
            time.sleep(0.02)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    return thread


def _woken_run(
    db: TestDatabase, engine: Engine, listen_engine: Engine | None, producer_url: URL
) -> assetq.SchedulerStats:
    """A scheduler with a 60 s poll and a producer that commits once it waits: the run
    comes from a wake-up or the test fails (wakeups == 0). The producer connects for each
    transaction (in session pooling a client keeps its server connection until it leaves)."""
    stop = threading.Event()
    producer_engine = _engine(producer_url, poolclass=sa.NullPool)
    producer = _producer_when_armed(db, producer_engine)
    stats = assetq.run_scheduler(
        engine,
        listen_engine=listen_engine,
        poll_interval=60,
        max_passes=20,
        stop_event=stop,
        on_run=lambda run: stop.set(),
    )
    producer.join(timeout=60)
    producer_engine.dispose()
    return stats


def test_a_direct_listen_engine_brings_the_wake_ups_back(
    pooled_db: TestDatabase, bouncer: PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    engine = _engine(bouncer.url(pooled_db.name))
    listen_engine = _engine(pooled_db.url)
    try:
        with caplog.at_level(logging.WARNING, logger="assetq"):
            stats = _woken_run(pooled_db, engine, listen_engine, bouncer.url(pooled_db.name))
    finally:
        engine.dispose()
        listen_engine.dispose()
    assert stats.runs == 1 and stats.wakeups >= 1
    assert _warnings(caplog, POOLED) == []
    _assert_clean(_session_state(bouncer, pooled_db.name))  # the locks were on the direct one


@pytest.mark.parametrize("bouncer", [("session", 4)], indirect=True)
def test_session_pooling_listens_through_the_pooler_and_leaves_nothing_for_the_next_client(
    pooled_db: TestDatabase, bouncer: PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    engine = _engine(bouncer.url(pooled_db.name))
    try:
        with caplog.at_level(logging.WARNING, logger="assetq"):
            stats = _woken_run(pooled_db, engine, None, bouncer.url(pooled_db.name))
    finally:
        engine.dispose()  # the clients leave: PgBouncer resets their server sessions
    assert stats.runs == 1 and stats.wakeups >= 1
    assert _warnings(caplog, POOLED) == []
    _assert_clean(_session_state(bouncer, pooled_db.name))
    assert _advisory_locks_in(pooled_db) == 0


@pytest.mark.parametrize("threshold", ["0", "None"])
def test_the_cli_takes_prepare_threshold_and_a_listen_url_in_the_url(
    pooled_db: TestDatabase, bouncer: PgBouncer, threshold: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = bouncer.url(pooled_db.name, prepare_threshold=threshold)
    _register(_engine(url), 6, "cli")
    shown = url.render_as_string(hide_password=False)
    direct = pooled_db.url.render_as_string(hide_password=False)
    with caplog.at_level(logging.WARNING, logger="assetq"):
        code = cli.main(["--url", shown, "scheduler", "--listen-url", direct, "--max-passes", "2"])
    assert code == 0
    assert _warnings(caplog, POOLED) == []
    assert len(pooled_db.links()) == 6
    assert cli.main(["--url", shown, "status"]) == 0


def test_a_prepare_threshold_the_cli_cannot_read_is_a_usage_error(
    pooled_db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    url = pooled_db.url.update_query_dict({"prepare_threshold": "often"})
    assert cli.main(["--url", url.render_as_string(hide_password=False), "status"]) == 2
    assert "prepare_threshold='often'" in capsys.readouterr().err


def test_the_demo_runs_through_transaction_pooling(
    db: TestDatabase, bouncer: PgBouncer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = bouncer.url(db.name).render_as_string(hide_password=False)
    argv = ["--url", url, "demo", "--producers", "2", "--events", "15", "--schedulers", "1"]
    assert cli.main(argv) == 0
    assert "0 lost, 0 duplicated" in capsys.readouterr().out
