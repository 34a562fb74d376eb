"""Online upgrades (issue 13 item 4, issue 25 item 4): an upgrade under live traffic, with one
producer transaction held open, never blocks producers longer than its lock timeout, completes
once that transaction ends, and loses, duplicates and fails nothing.

The upgrade is what a newer package brings: table steps after the baseline (the test-only
revisions in tests/revisions: a column added to asset_event, the producers' table, then an
index on it) and changed routine bodies (tests/changed_files.py: register_event, which the
producers call; schedule_pass, which the scheduler calls; the fan-out, which every producer's
INSERT fires, and on MySQL the routines it calls), applied by assetq.routines.sync under the
same traffic.

The interleaving is forced: the held transaction has registered an event (so it holds what a
producer holds: the event tables, the asset's and the consumer's rows) and stays open until
the upgrade has failed on its lock timeout several times, read from the upgrade's own retry
records (the database's 55P03 / 1205), and for longer than a producer's own lock timeout.
Producers and a scheduler run all along, each with a lock timeout of its own
(PRODUCER_LOCK_TIMEOUT): a producer queued behind an upgrade that waits for the held
transaction would fail with that timeout's error. None does, none finds a routine missing
(MariaDB replaces each with CREATE OR REPLACE, PostgreSQL in place), and producers keep
committing while the upgrade is stuck. At the end every event is consumed exactly once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

import assetq
from assetq import migrate, routines
from changed_files import shipped
from dbs import TestDatabase

TEST_REVISIONS = Path(__file__).parent / "revisions"

#: The upgrade's lock timeout, in seconds (MySQL's lock timeouts take whole seconds).
UPGRADE_LOCK_TIMEOUT = {"postgresql": 0.2, "mysql": 1.0}
#: A producer's and the scheduler's own lock timeout: the upgrade's plus what one revision
#: takes once it has its locks (well under a second here), with room for a loaded machine.
PRODUCER_LOCK_TIMEOUT = {"postgresql": 3.0, "mysql": 4.0}
#: Lock timeouts the upgrade meets before the held transaction ends.
RETRIES = 3
#: Give up (and fail) if the upgrade shows no retry, or does not finish, within this.
DEADLINE = 90.0

#: The scheduler pass as every revision has it (its result columns changed over time).
SCHEDULE = {
    "postgresql": "SELECT count(*) FROM {ns}.schedule_pass(10)",
    "mysql": "CALL {ns}.schedule_pass(10)",
}

#: Events neither queued for the consumer nor consumed by a run of it.
UNQUEUED = (
    "SELECT count(*) FROM {ns}.asset_event e"
    " WHERE NOT EXISTS (SELECT 1 FROM {ns}.asset_dag_run_queue q WHERE q.asset_event_id = e.id)"
    " AND NOT EXISTS (SELECT 1 FROM {ns}.dagrun_asset_event l WHERE l.asset_event_id = e.id)"
)


@dataclass
class Traffic:
    """Producers and a scheduler in threads, each transaction with its own lock timeout."""

    db: TestDatabase
    stop: threading.Event = field(default_factory=threading.Event)
    committed: int = 0
    errors: list[str] = field(default_factory=list)
    #: Calls that found their routine missing (MySQL 1305: MySQL proper replaces a routine
    #: with DROP then CREATE, so a call in between would fail); retried, and counted.
    vanished: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _timeout(self, conn: sa.Connection) -> None:
        seconds = PRODUCER_LOCK_TIMEOUT[self.db.engine_name]
        sql = migrate._upgrade_sql(self.db.dialect, "set_lock_timeout", self.db.namespace)
        if self.db.engine_name == "postgresql":
            conn.execute(sa.text(sql), {"value": f"{int(seconds * 1000)}ms"})
        else:
            whole = int(seconds)
            conn.execute(
                sa.text(sql), {"lock_wait_timeout": whole, "innodb_lock_wait_timeout": whole}
            )

    def _loop(self, work: Callable[[sa.Connection], None], counts: bool) -> None:
        with self.db.engine.connect() as conn:
            while not self.stop.is_set():
                try:
                    with conn.begin():
                        work(conn)
                except DBAPIError as exc:
                    code = self.db.dialect.error_code(exc)
                    if code in ("1213", "40P01"):  # a deadlock with a scheduler: retried
                        continue
                    if code == "1305":
                        with self.lock:
                            self.vanished.append(work.__name__)
                        continue
                    with self.lock:
                        self.errors.append(f"{work.__name__}: {code} {exc.orig}")
                    return
                if counts:
                    with self.lock:
                        self.committed += 1

    def produce(self, conn: sa.Connection) -> None:
        self._timeout(conn)
        register_event(self.db, conn)

    def schedule(self, conn: sa.Connection) -> None:
        # READ COMMITTED, as the scheduler always runs (DESIGN.md, MariaDB facts), first.
        self.db.dialect.execute(conn, "scheduler_transaction", self.db.namespace)
        self._timeout(conn)
        result = conn.execute(sa.text(self.db.sql(SCHEDULE[self.db.engine_name])))
        if result.returns_rows:
            result.all()
        self.db.dialect._drain(conn)

    def start(self, producers: int) -> None:
        work = [(self.produce, True)] * producers + [(self.schedule, False)]
        for fn, counts in work:
            thread = threading.Thread(target=self._loop, args=(fn, counts), daemon=True)
            thread.start()
            self.threads.append(thread)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(DEADLINE)


def register_event(db: TestDatabase, conn: sa.Connection) -> int:
    """One event of asset orders, in ``conn``'s transaction; its id."""
    params = {
        "asset": "orders",
        "extra": "{}",
        "source_dag_id": None,
        "source_task_id": None,
        "source_run_id": None,
        "source_map_index": -1,
        "idempotency_key": None,
    }
    (row,) = db.dialect.execute(conn, "register_event", db.namespace, params)
    return int(row.event_id)


class Retries(logging.Handler):
    """The upgrade's retry records: one per step that met a lock timeout or a deadlock."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "retrying" in message and "upgrade to" in message:
            self.records.append(message)


def _at_package_head(db: TestDatabase) -> None:
    """This package's schema (no test step), with one consumer of the asset producers
    register on."""
    assetq.install(db.engine)
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, "orders", namespace=db.namespace)
        assetq.declare_dag(conn, "orders_report", "orders", namespace=db.namespace)


#: What the newer package changed, per engine: a routine of each kind of caller, the fan-out.
CHANGED = {
    "postgresql": ("register_event", "schedule_pass", "asset_event_fan_out"),
    "mysql": (
        "register_event",
        "schedule_pass",
        "asset_event_fan_out",
        "partition_fan_out",
        "partition_map",
    ),
}


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _upgrade_under_traffic(db: TestDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    _at_package_head(db)
    migrate.use_revisions(str(TEST_REVISIONS))
    migrate.forget_checks()
    try:
        with shipped(monkeypatch, {db.engine_name: CHANGED[db.engine_name]}) as files:
            _upgrade(db)
            with db.engine.connect() as conn:
                recorded = routines.catalogue(conn, db.namespace)
    finally:
        migrate.use_revisions(None)
        migrate.forget_checks()
    for f in files[db.engine_name]:
        assert recorded[(f.kind, f.name)].checksum == f.checksum, f.name  # the new bodies


def _upgrade(db: TestDatabase) -> None:
    retries = Retries()
    logger = logging.getLogger("assetq")
    logger.addHandler(retries)
    traffic = Traffic(db)
    outcome: list[object] = []

    def upgrade() -> None:
        try:
            outcome.append(
                assetq.install(
                    db.engine,
                    lock_timeout=UPGRADE_LOCK_TIMEOUT[db.engine_name],
                    max_attempts=1000,
                )
            )
        except Exception as exc:  # reported by the assertion below
            outcome.append(exc)

    held = db.engine.connect()
    upgrader = threading.Thread(target=upgrade, daemon=True)
    try:
        held_transaction = held.begin()
        register_event(db, held)
        traffic.start(producers=2)
        held_since = time.monotonic()
        upgrader.start()
        # A revision that needs no lock a producer holds (0008: routine bodies only) is
        # done without waiting: nothing to be stuck on.
        _wait(
            lambda: len(retries.records) >= RETRIES or bool(outcome),
            f"{RETRIES} lock timeouts of the upgrade",
        )
        with traffic.lock:
            committed_while_stuck = traffic.committed
        # Long enough that a producer queued behind a waiting upgrade would have met its own
        # lock timeout: this sets the stage, the errors below decide.
        producer_timeout = PRODUCER_LOCK_TIMEOUT[db.engine_name]
        _wait(lambda: time.monotonic() - held_since > producer_timeout + 0.5, "the hold")
        _wait(
            lambda: traffic.committed > committed_while_stuck + 5 or bool(traffic.errors),
            "producers committing while the upgrade is stuck",
        )
        done_during_hold = bool(outcome)
        stuck = len(retries.records)
        held_transaction.commit()
        upgrader.join(DEADLINE)
        assert not upgrader.is_alive(), "the upgrade did not finish after the transaction ended"
    finally:
        traffic.finish()
        held.close()
        logger.removeHandler(retries)

    assert outcome == [migrate.head_revision()], outcome
    assert traffic.errors == [], "a producer or the scheduler was blocked past its lock timeout"
    # The upgrade gave up on its lock timeout (the database's own error) while the
    # transaction was held, then finished once it ended.
    timeouts = [r for r in retries.records if "55P03" in r or "1205" in r]
    assert done_during_hold or (stuck >= RETRIES and len(timeouts) >= RETRIES), retries.records
    with db.engine.connect() as conn:
        assert migrate.current_revision(conn, namespace=db.namespace) == migrate.head_revision()
    # Every committed event is there (the held one included), and reached the consumer:
    # queued for it or consumed by one of its runs (I1 across the upgrade).
    events = db.scalar("SELECT count(*) FROM {ns}.asset_event")
    assert events == traffic.committed + 1
    unqueued = db.scalar(UNQUEUED)
    assert unqueued == 0, f"{unqueued} events committed during the upgrade were not fanned out"
    # No call found a routine missing: PostgreSQL replaces in place, MariaDB with CREATE OR
    # REPLACE. MySQL proper has neither: it drops and creates (routines.replaces_atomically),
    # and a call in between fails with 1305 (docs/operations.md): counted above as nothing
    # written, and the producer's next transaction went on.
    with db.engine.connect() as conn:
        if db.engine_name == "postgresql" or routines.replaces_atomically(conn):
            assert traffic.vanished == [], traffic.vanished
    # Exactly once: drained, every event is linked to one run of the consumer, once.
    while assetq.schedule(db.engine, namespace=db.namespace, limit=100):
        pass
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == 0
    links = db.rows(
        "SELECT asset_event_id, count(*) AS n FROM {ns}.dagrun_asset_event GROUP BY asset_event_id"
    )
    assert len(links) == events and all(r.n == 1 for r in links)


def test_an_upgrade_under_traffic_never_blocks_producers_past_its_lock_timeout(
    empty_db: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    _upgrade_under_traffic(empty_db, monkeypatch)
