"""MariaDB Galera (galera-4): a 3-node cluster of private mariadbd processes (tests/servers.py).

The recommended layout (docs/deployment.md): producers on every node, schedulers on one
writer node. Certification conflicts come as error 1213, also at a producer's COMMIT, which
never happens on one server: the producer recipe retries with the idempotency key, so every
acknowledged event exists exactly once and is consumed exactly once. Schedulers on every node
collide (SKIP LOCKED and GET_LOCK are per node) and certification aborts one side: with a
larger pass retry budget exactly-once still holds, with a node killed meanwhile.

A cluster takes about 25 s to start on this machine kind: these tests run with `-m slow`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine

import assetq
from servers import GaleraCluster, start_galera

pytestmark = pytest.mark.slow


@pytest.fixture
def galera(pytestconfig: pytest.Config) -> Iterator[GaleraCluster]:
    if "mysql" not in str(pytestconfig.getoption("--engines")):
        pytest.skip("MySQL is not among the engines of this run (--engines)")
    cluster = start_galera(3)
    try:
        engine = sa.create_engine(cluster.nodes[0].url())
        assetq.install(engine)  # DDL and routines replicate (total order isolation)
        with engine.begin() as conn:
            assetq.declare_dag(conn, "report", "orders")
            assetq.declare_dag(conn, "audit", "orders")
        engine.dispose()
        yield cluster
    finally:
        cluster.stop()


class _Producer(threading.Thread):
    """Registers one event per key with the documented recipe, on its node; after a lost
    connection it moves to the next engine of ``engines`` (a client with several nodes)."""

    def __init__(self, engines: list[Engine], keys: list[str]) -> None:
        super().__init__(daemon=True)
        self.engines = engines
        self.keys = keys
        self.acked: dict[str, int] = {}
        self.retries = 0
        self.failure: BaseException | None = None

    def run(self) -> None:
        give_up = time.monotonic() + 300
        current = 0
        try:
            for key in self.keys:
                while True:
                    try:
                        with self.engines[current].begin() as conn:
                            event = assetq.register_event(conn, "orders", idempotency_key=key)
                        break
                    except (assetq.TransientError, sa.exc.OperationalError) as exc:
                        self.retries += 1
                        if time.monotonic() > give_up:
                            raise
                        if isinstance(exc, assetq.ConnectionLost) or (
                            isinstance(exc, sa.exc.OperationalError)
                            and getattr(exc.orig, "args", (None,))[0] in (2003, 2006, 2013)
                        ):
                            current = (current + 1) % len(self.engines)
                        time.sleep(0.02)
                self.acked[key] = event.id
        except BaseException as exc:
            self.failure = exc


def _verify(engine: Engine, acked: dict[str, int]) -> None:
    with engine.connect() as conn:
        events = dict(
            conn.execute(sa.text("SELECT idempotency_key, id FROM assetq.asset_event")).all()
        )
        links = conn.execute(
            sa.text("SELECT dag_id, asset_event_id FROM assetq.dagrun_asset_event")
        ).all()
        queued = conn.execute(sa.text("SELECT count(*) FROM assetq.asset_dag_run_queue")).scalar()
    assert {k: events.get(k) for k in acked} == acked  # 0 acknowledged lost
    assert len(events) == len(acked)  # one event per key
    for dag_id in ("report", "audit"):  # each event consumed once by each consumer
        assert sorted(e for d, e in links if d == dag_id) == sorted(events.values())
    assert queued == 0


def _drain(engine: Engine) -> None:
    for _ in range(1000):
        if not assetq.schedule(engine, max_attempts=50):
            return


def test_producers_on_every_node_and_a_scheduler_on_one_consume_each_event_once(
    galera: GaleraCluster,
) -> None:
    engines = [sa.create_engine(node.url()) for node in galera.nodes]
    producers = [
        _Producer([engines[i]], [f"n{i}-{k}" for k in range(300)]) for i in range(len(engines))
    ]
    stop = threading.Event()
    scheduler = threading.Thread(
        target=assetq.run_scheduler,
        args=(engines[0],),
        kwargs={"poll_interval": 0.05, "stop_event": stop, "backoff_max": 0.5},
        daemon=True,
    )
    try:
        scheduler.start()
        for producer in producers:
            producer.start()
        for producer in producers:
            producer.join(timeout=300)
        stop.set()
        scheduler.join(timeout=60)
        _drain(engines[0])
        assert [p.failure for p in producers] == [None] * len(producers)
        acked = {k: v for p in producers for k, v in p.acked.items()}
        _verify(engines[0], acked)
    finally:
        stop.set()
        for engine in engines:
            engine.dispose()


def test_schedulers_on_every_node_with_a_node_killed_still_consume_each_event_once(
    galera: GaleraCluster,
) -> None:
    engines = [sa.create_engine(node.url(), pool_pre_ping=True) for node in galera.nodes]
    producers = [
        _Producer(engines[i:] + engines[:i], [f"n{i}-{k}" for k in range(300)])
        for i in range(len(engines))
    ]
    stop = threading.Event()
    stats: list[assetq.SchedulerStats] = []

    def schedule_on(engine: Engine) -> None:
        stats.append(
            assetq.run_scheduler(
                engine, poll_interval=0.05, stop_event=stop, backoff_max=0.5, max_attempts=50
            )
        )

    schedulers = [threading.Thread(target=schedule_on, args=(e,), daemon=True) for e in engines]
    try:
        for thread in [*schedulers, *producers]:
            thread.start()
        deadline = time.monotonic() + 120
        while sum(len(p.acked) for p in producers) < 300 and time.monotonic() < deadline:
            time.sleep(0.01)
        galera.nodes[2].kill()  # kill -9: its producer moves to another node
        for producer in producers:
            producer.join(timeout=300)
        stop.set()
        for thread in schedulers:
            thread.join(timeout=60)
        _drain(engines[0])
        assert [p.failure for p in producers] == [None] * len(producers)
        acked = {k: v for p in producers for k, v in p.acked.items()}
        _verify(engines[0], acked)
        print(  # the measured retry counts, for docs/deployment.md (-s shows them)
            "galera: producer retries",
            [p.retries for p in producers],
            "scheduler errors",
            [s.errors for s in stats],
        )
    finally:
        stop.set()
        for engine in engines:
            engine.dispose()
