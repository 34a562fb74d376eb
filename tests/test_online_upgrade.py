"""Online upgrades (issue 13 item 4): an upgrade under live traffic, with one producer
transaction held open, never blocks producers longer than its lock timeout, and completes once
that transaction ends.

The interleaving is forced: the held transaction has registered an event (so it holds what a
producer holds: the event tables, the asset's and the consumer's rows through the foreign keys)
and stays open until the upgrade has failed on its lock timeout several times, read from the
upgrade's own retry records (the database's 55P03 / 1205), and for longer than a producer's own
lock timeout. Producers and a scheduler run all along, each with a lock timeout of its own
(PRODUCER_LOCK_TIMEOUT): a producer queued behind an upgrade that waits for the held transaction
(what happened before: every producer waited as long as the open transaction lasted) would fail
with that timeout's error. None does, and producers keep committing while the upgrade is stuck
(counted from the events' own timestamps in the database).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

import assetq
from assetq import migrate
from assetq.dialects import MYSQL
from dbs import TestDatabase

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
    #: Calls that found their routine missing (MySQL 1305): MySQL replaces a routine with
    #: DROP then CREATE, so a call in between fails; the call is retried.
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


def _at_revision(db: TestDatabase, start: str) -> None:
    """``start`` installed, with one consumer of the asset producers register on (declared
    through this package at head, then downgraded: declare_dag's signature changed)."""
    assetq.install(db.engine)
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, "orders", namespace=db.namespace)
        assetq.declare_dag(conn, "orders_report", "orders", namespace=db.namespace)
    with db.engine.begin() as conn:
        migrate.migrate_connection(conn, db.namespace, start, direction="down")


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _upgrade_under_traffic(db: TestDatabase, start: str) -> None:
    _at_revision(db, start)
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
    assert traffic.vanished == [] or db.engine_name == "mysql", traffic.vanished
    assert "produce" not in traffic.vanished


#: The default suite's starting revision: 0003, so that every later revision runs under
#: traffic, on both engines.
DEFAULT_START = {"postgresql": "0003_operations", "mysql": "0003_operations"}


def test_an_upgrade_under_traffic_never_blocks_producers_past_its_lock_timeout(
    empty_db: TestDatabase,
) -> None:
    _upgrade_under_traffic(empty_db, DEFAULT_START[empty_db.engine_name])


@pytest.mark.slow
@pytest.mark.parametrize("start", migrate.revisions()[:-1])
def test_an_upgrade_from_every_older_revision_under_traffic(
    empty_db: TestDatabase, start: str
) -> None:
    _upgrade_under_traffic(empty_db, start)


def test_mysql_a_registration_waiting_for_a_trigger_swap_of_0004_is_fanned_out(
    empty_db: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0004_semantics replaces the fan-out trigger under LOCK TABLES (see its script): a
    register_event CALL that began before a swap and waits for the lock fires the new trigger
    once it has it, completes, and its event is queued. Forced: at each swap, after the LOCK
    TABLES, one CALL from a session whose previous CALL fired the trigger being replaced,
    waiting for the lock before the DROP TRIGGER runs. On MariaDB 10.11 such a CALL fails with
    1146 when the new trigger reads a table the old one did not (a one-step swap from 0003's
    trigger to 0004's), and without the lock an event inserted between the DROP and the CREATE
    gets no queue row."""
    db = empty_db
    if db.engine_name != "mysql":
        pytest.skip("MySQL only: PostgreSQL replaces the trigger function in one statement")
    _at_revision(db, "0003_operations")
    producer = db.engine.connect()
    producer.execute(sa.text("SET SESSION lock_wait_timeout = 60"))
    producer_id = producer.execute(sa.text("SELECT CONNECTION_ID()")).scalar_one()
    producer.commit()
    events: list[int] = []
    swaps: list[list[str]] = []

    def waiting_for_the_lock() -> bool:
        state = db.scalar(
            "SELECT state FROM information_schema.PROCESSLIST WHERE id = :id", id=producer_id
        )
        return state == "Waiting for table metadata lock"

    def interleaved(self: Any, conn: sa.Connection, statements: Sequence[str]) -> None:
        """The script's statements one by one, as run_statements sends them, with a CALL
        waiting for each LOCK TABLES through its trigger swap."""
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        waiting: threading.Thread | None = None
        outcome: list[object] = []

        def call() -> None:
            try:
                with producer.begin():
                    outcome.append(register_event(db, producer))
            except Exception as exc:  # reported by the assertion below
                outcome.append(exc)

        try:
            for statement in statements:
                if statement.startswith("LOCK TABLES"):
                    with producer.begin():  # fires the trigger this swap replaces
                        events.append(register_event(db, producer))
                    swaps.append([])
                cursor.execute(statement)
                while cursor.nextset():
                    pass
                if statement.startswith("LOCK TABLES"):
                    waiting = threading.Thread(target=call, daemon=True)
                    waiting.start()
                    _wait(waiting_for_the_lock, "the CALL to wait for the lock")
                elif waiting is not None:
                    swaps[-1].append(statement.split("\n", 1)[0])
                if statement.startswith("UNLOCK TABLES") and waiting is not None:
                    waiting.join(DEADLINE)
                    assert len(outcome) == 1 and isinstance(outcome[0], int), outcome
                    events.append(outcome.pop())
                    waiting = None
        finally:
            if waiting is not None:
                cursor.execute("UNLOCK TABLES")
                waiting.join(DEADLINE)
            cursor.close()

    monkeypatch.setattr(type(MYSQL), "run_statements", interleaved)
    try:
        assert assetq.install(db.engine, revision="0004_semantics") == "0004_semantics"
    finally:
        producer.close()
    trigger = f"DROP TRIGGER IF EXISTS {db.dialect.quote_ns(db.namespace)}.asset_event_fan_out"
    assert swaps and all(s[0] == trigger and s[-1] == "UNLOCK TABLES" for s in swaps), swaps
    # Every event, the ones registered before each swap and the ones that waited for it, is
    # queued for the consumer, once.
    assert len(events) == 2 * len(swaps)
    rows = db.rows("SELECT asset_event_id, target_dag_id FROM {ns}.asset_dag_run_queue")
    assert sorted((r.asset_event_id, r.target_dag_id) for r in rows) == [
        (e, "orders_report") for e in sorted(events)
    ]
