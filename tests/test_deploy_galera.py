"""MariaDB Galera (galera-4): a 3-node cluster of private mariadbd processes (tests/servers.py).

The recommended layout (docs/deployment.md): producers on every node, schedulers on one
writer node. Certification conflicts come as error 1213, also at a producer's COMMIT, which
never happens on one server: the producer recipe retries with the idempotency key, so every
acknowledged event exists exactly once and is consumed exactly once. Schedulers on every node
collide (SKIP LOCKED and GET_LOCK are per node) and certification aborts one side: with a
larger pass retry budget exactly-once still holds, with a node killed (`kill -9`) meanwhile.

A cluster starts in about 10-20 s on this machine kind (start_galera says how). The default
suite runs the short version of the node-killed test (60 events per node); `-m slow` runs the
long one (300 per node) and the one-writer layout. Nothing here depends on timing: the kill
comes after a number of acknowledged events, and deadlines only catch hangs.

Installs (issue 13, item 6): GET_LOCK is per node, so two installs started on two nodes both
got it and ran at once. An install on Galera also takes a lock that DDL's total order makes
cluster-wide (creating a table, migrate._take_cluster_lock); the test holds one installer
inside it and starts another on another node.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine

import assetq
from servers import GaleraCluster, start_galera

#: MySQL client errors of a connection that is gone or a node that cannot serve (2003 cannot
#: connect, 2006 server gone, 2013 lost during a query, 1047 node not ready / not primary):
#: the producer moves to another node, as a client with several nodes does.
_NODE_GONE = (2003, 2006, 2013, 1047)


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
    """Registers one event per key with the documented recipe (docs/deployment.md, Failover):
    each in its own transaction, retried with the same idempotency key on a transient error
    or a lost connection, at connect, during the call or at COMMIT. After a lost connection
    it moves to the next engine of ``engines`` (a client with several nodes)."""

    def __init__(self, engines: list[Engine], keys: list[str]) -> None:
        super().__init__(daemon=True)
        self.engines = engines
        self.keys = keys
        self.acked: dict[str, int] = {}
        self.retries = 0
        self.moves = 0
        self.failure: BaseException | None = None

    def run(self) -> None:
        give_up = time.monotonic() + 300  # catches a hang only
        current = 0
        try:
            for key in self.keys:
                while True:
                    try:
                        with self.engines[current].begin() as conn:
                            event = assetq.register_event(conn, "orders", idempotency_key=key)
                        break
                    except (
                        assetq.TransientError,
                        sa.exc.OperationalError,
                        sa.exc.InterfaceError,
                    ) as exc:
                        self.retries += 1
                        if time.monotonic() > give_up:
                            raise
                        if _node_gone(exc):
                            current = (current + 1) % len(self.engines)
                            self.moves += 1
                        time.sleep(0.02)
                self.acked[key] = event.id
        except BaseException as exc:
            self.failure = exc


def _node_gone(exc: Exception) -> bool:
    if isinstance(exc, (assetq.ConnectionLost, sa.exc.InterfaceError)):
        return True
    code = getattr(getattr(exc, "orig", None), "args", (None,))[0]
    return isinstance(exc, sa.exc.OperationalError) and code in _NODE_GONE


def _verify(engine: Engine, acked: dict[str, int]) -> None:
    """Every acknowledged event exists, once per key, and each consumer linked each event
    exactly once; nothing is left queued. Read with wsrep_sync_wait, so a node that is
    still applying the others' write-sets answers only once it has them."""
    with engine.connect() as conn:
        conn.execute(sa.text("SET SESSION wsrep_sync_wait = 1"))
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


def _wait_until_consumed(engine: Engine, deadline: float) -> None:
    """Until nothing is queued (the schedulers running elsewhere consumed it all)."""
    while True:
        with engine.connect() as conn:
            queued = conn.execute(
                sa.text("SELECT count(*) FROM assetq.asset_dag_run_queue")
            ).scalar_one()
        if queued == 0 or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _drain(engine: Engine) -> None:
    for _ in range(1000):
        if not assetq.schedule(engine, max_attempts=50):
            return


@pytest.mark.slow
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
        assert [p.is_alive() for p in producers] == [False] * len(producers)
        _drain(engines[0])
        assert [p.failure for p in producers] == [None] * len(producers)
        acked = {k: v for p in producers for k, v in p.acked.items()}
        for engine in engines:
            _verify(engine, acked)
    finally:
        stop.set()
        for engine in engines:
            engine.dispose()


def _scheduler_process(url: str, stop: Any, results: Any) -> None:
    """A scheduler in a process of its own (spawned), so that it can die with its node: the
    documented budget for schedulers on every node (max_attempts=50)."""
    engine = sa.create_engine(url, pool_pre_ping=True)
    with engine.connect():
        results.put(("ready", url))  # connected: the test starts its producers after this
    stats = assetq.run_scheduler(
        engine, poll_interval=0.05, stop_event=stop, backoff_max=0.5, max_attempts=50
    )
    results.put((url, stats.runs, stats.errors))


@pytest.mark.parametrize("per_node", [60, pytest.param(300, marks=pytest.mark.slow)])
def test_schedulers_on_every_node_with_a_node_killed_still_consume_each_event_once(
    galera: GaleraCluster, per_node: int
) -> None:
    """Producers and schedulers on all 3 nodes. Once a third of the events are acknowledged,
    node2's machine dies: kill -9 of its mariadbd and of the scheduler process on it. Its
    producer (a client elsewhere) moves to another node and finishes there; the two nodes
    left keep the quorum. Every acknowledged event is then on both survivors, consumed
    exactly once by each of the two consumers."""
    urls = [node.url().render_as_string(hide_password=False) for node in galera.nodes]
    engines = [sa.create_engine(url, pool_pre_ping=True) for url in urls]
    producers = [
        _Producer(engines[i:] + engines[:i], [f"n{i}-{k}" for k in range(per_node)])
        for i in range(len(engines))
    ]
    # Spawned before any thread of this test starts: a fork would copy held locks.
    context = multiprocessing.get_context("spawn")
    # One stop event each: a process killed while it waits on a shared multiprocessing
    # Event leaves the Event's condition inconsistent, and setting it then hung the test.
    stops = [context.Event() for _ in urls]
    results = context.Queue()
    schedulers = [
        context.Process(target=_scheduler_process, args=(url, stop, results), daemon=True)
        for url, stop in zip(urls, stops, strict=True)
    ]
    total = per_node * len(engines)
    try:
        for scheduler in schedulers:
            scheduler.start()
        ready = sorted(results.get(timeout=120) for _ in schedulers)  # catches a hang only
        assert ready == sorted(("ready", url) for url in urls)
        for producer in producers:
            producer.start()
        deadline = time.monotonic() + 120  # catches a hang only
        # A third of the events, node2's producer's first among them: the kill comes mid-run
        # for it (a loaded machine once let the two others ack a third alone).
        while (
            sum(len(p.acked) for p in producers) < total // 3 or not producers[2].acked
        ) and time.monotonic() < deadline:
            time.sleep(0.01)
        acked_on_node2 = len(producers[2].acked)
        # The machine of node2 dies: its scheduler and its mariadbd, kill -9 both.
        os.kill(schedulers[2].pid, signal.SIGKILL)  # type: ignore[arg-type]
        galera.nodes[2].kill()
        for producer in producers:
            producer.join(timeout=300)
        # The schedulers consume everything themselves (the deadline only catches a hang).
        _wait_until_consumed(engines[0], deadline=time.monotonic() + 120)
        for stop in stops[:2]:  # the survivors'
            stop.set()
        for scheduler in schedulers:
            scheduler.join(timeout=60)
        assert [p.is_alive() for p in producers] == [False] * len(producers)
        assert [p.failure for p in producers] == [None] * len(producers)
        # The kill came mid-run: node2's producer had keys left, and finished them elsewhere.
        assert 0 < acked_on_node2 < per_node
        assert producers[2].moves >= 1
        # The survivors' loops stopped when told; the dead one was killed.
        assert [s.exitcode for s in schedulers] == [0, 0, -signal.SIGKILL]
        stats = sorted(results.get(timeout=10) for _ in schedulers[:2])
        assert sum(runs for _, runs, _ in stats) > 0  # the survivors scheduled after the kill
        acked = {k: v for p in producers for k, v in p.acked.items()}
        assert len(acked) == total
        for engine in engines[:2]:  # the same on both survivors
            _verify(engine, acked)
        print(  # the measured retry counts, for docs/deployment.md (-s shows them)
            "galera: producer retries",
            [p.retries for p in producers],
            "moves",
            [p.moves for p in producers],
            "surviving schedulers' (url, runs, errors)",
            stats,
        )
    finally:
        for stop, scheduler in zip(stops, schedulers, strict=True):
            if scheduler.is_alive():  # never the killed one's (see above)
                stop.set()
        for scheduler in schedulers:
            if scheduler.is_alive():
                scheduler.kill()
                scheduler.join(timeout=10)
        for engine in engines:
            engine.dispose()


def _installer_process(
    url: str, namespace: str, hold: bool, events: dict[str, Any], results: Any
) -> None:
    """One install of ``namespace`` through one node, in a process of its own (a client on
    another machine). With ``hold`` it stops inside the install lock, just before creating
    the schema, until ``events["proceed"]``; ``events["waiting"]`` is set when it logs that
    another node holds the lock. Reports (revision or error, fresh installs it ran)."""
    import logging

    from assetq import migrate

    fresh = migrate._fresh_install
    ran: list[str] = []

    def counted(*args: Any, **kwargs: Any) -> None:
        ran.append(namespace)
        if hold:
            events["reached"].set()
            events["proceed"].wait(120)
        fresh(*args, **kwargs)

    migrate._fresh_install = counted  # type: ignore[assignment]

    class Waiting(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "waiting for the install lock" in record.getMessage():
                events["waiting"].set()

    logging.getLogger("assetq.migrate").addHandler(Waiting())
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        results.put((hold, assetq.install(engine, namespace=namespace), len(ran)))
    except Exception as exc:
        results.put((hold, f"{type(exc).__name__}: {exc}", len(ran)))
    finally:
        engine.dispose()


def test_two_installs_started_on_two_nodes_at_once_run_one_after_the_other(
    galera: GaleraCluster,
) -> None:
    """node0's installer is held inside its install lock; node1's, started then, waits for it
    (it used to install at the same time: GET_LOCK is per node), and once node0's is done
    finds the schema installed and changes nothing. One schema results, the same on every
    node, with one version row and no lock left."""
    namespace = "raced"
    urls = [node.url().render_as_string(hide_password=False) for node in galera.nodes]
    context = multiprocessing.get_context("spawn")
    events = {name: context.Event() for name in ("reached", "proceed", "waiting")}
    results = context.Queue()
    holder = context.Process(
        target=_installer_process, args=(urls[0], namespace, True, events, results)
    )
    other = context.Process(
        target=_installer_process, args=(urls[1], namespace, False, events, results)
    )
    try:
        holder.start()
        assert events["reached"].wait(120), "node0's install never got its lock"
        other.start()
        deadline = time.monotonic() + 60  # catches a hang only
        while other.is_alive() and not events["waiting"].wait(0.05):
            assert time.monotonic() < deadline, "node1's install neither waited nor ended"
        ran_alongside = not other.is_alive()
        events["proceed"].set()
        holder.join(120)
        other.join(120)
        got = dict(
            (
                (hold, (revision, fresh))
                for hold, revision, fresh in (results.get(timeout=10) for _ in range(2))
            )
        )
    finally:
        events["proceed"].set()
        for process in (holder, other):
            if process.is_alive():
                process.kill()
    assert not ran_alongside, f"node1's install ran while node0's held the lock: {got}"
    head = assetq.head_revision()
    assert got == {True: (head, 1), False: (head, 0)}
    objects = (
        "SELECT (SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = :ns),"
        " (SELECT count(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = :ns),"
        " (SELECT count(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = :ns)"
    )
    found = []
    for url in urls:
        engine = sa.create_engine(url, poolclass=sa.NullPool)
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SET SESSION wsrep_sync_wait = 1"))
                versions = conn.execute(
                    sa.text(f"SELECT version_num FROM {namespace}.assetq_alembic_version")
                ).all()
                found.append(
                    (
                        tuple(v for (v,) in versions),
                        tuple(conn.execute(sa.text(objects), {"ns": namespace}).one()),
                    )
                )
        finally:
            engine.dispose()
    reference = found[0]
    assert reference[0] == (head,)
    assert found == [reference] * len(urls)
