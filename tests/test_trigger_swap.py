"""The fan-out trigger and the routines it calls are replaced without losing or failing a
producer's event (I1, I12; issue 25 item 3).

A newer package that changes the fan-out is applied by assetq.routines.sync. Forced here, on
both engines: a producer transaction has registered an event (its INSERT fired the fan-out,
and on MySQL the routines the trigger calls: partition_fan_out and partition_map, reached
through an alias resolution) and stays open; the sync that replaces them starts and waits
for it; a second producer starts and waits behind the sync; then the first commits. Both
events end queued once, by whichever body their INSERT ran, and nobody got an error (on
MySQL proper the second producer gets a transient error instead, below).

PostgreSQL replaces the trigger function in place (no lock a producer holds) and the trigger
with CREATE OR REPLACE TRIGGER, which waits for the open producer. MariaDB replaces the
trigger and each routine with CREATE OR REPLACE, which waits for the open producer's
metadata locks, new callers queueing behind it; they then run the new bodies (measured with
plain procedures first: the caller that waited ran the new body, none failed). MySQL proper
drops and re-creates instead (routines.replaces_atomically), the trigger under LOCK TABLES:
tests/test_repair.py forces that path on MariaDB. There (MySQL 9.7) the second producer's
INSERT waits for the routine the sync is dropping and then finds it gone: 1305, a
RoutineUnavailable, transient, with nothing written; its retry is fanned out by the new
bodies (docs/operations.md).
"""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

import assetq
from assetq import routines
from changed_files import shipped
from dbs import TestDatabase
from races import in_thread

#: The fan-out's objects, per engine.
FAN_OUT = {
    "postgresql": ("asset_event_fan_out",),  # the trigger function and the trigger itself
    "mysql": ("asset_event_fan_out", "partition_fan_out", "partition_map"),
}

#: Sessions of the test's server waiting for a lock a transaction holds (row, table or, on
#: MySQL, metadata lock: which INNODB_TRX does not show).
WAITING = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND wait_event_type = 'Lock'",
    "mysql": "SELECT count(*) FROM information_schema.PROCESSLIST"
    " WHERE STATE LIKE 'Waiting for%lock%'",
}


def _wait_for_waiters(db: TestDatabase, count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while db.scalar(WAITING[db.engine_name]) < count:
        assert time.monotonic() < deadline, f"{count} sessions never waited for a lock"
        time.sleep(0.05)


def test_a_producer_blocked_in_the_middle_of_the_fan_out_swap_is_fanned_out_once(
    db: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", assetq.alias("feed"), namespace=db.namespace)
        assetq.declare_dag(conn, "direct", "orders", namespace=db.namespace)
        assetq.register_event(conn, "orders", aliases=["feed"], namespace=db.namespace)
    held = db.engine.connect()
    held_transaction = held.begin()
    # Its INSERT fires the fan-out (through the alias: on MySQL its routines too).
    first = assetq.register_event(held, "orders", aliases=["feed"], namespace=db.namespace)
    try:
        with shipped(monkeypatch, {db.engine_name: FAN_OUT[db.engine_name]}) as files:
            sync, synced = in_thread(
                lambda: assetq.install(db.engine, namespace=db.namespace, lock_timeout=60)
            )
            _wait_for_waiters(db, 1)  # the swap waits for the open producer

            def produce() -> int:
                with db.engine.begin() as conn:
                    event = assetq.register_event(
                        conn, "orders", aliases=["feed"], namespace=db.namespace
                    )
                return event.id

            with db.engine.connect() as conn:
                in_place = db.engine_name == "postgresql" or routines.replaces_atomically(conn)
            producer, produced = in_thread(produce)
            _wait_for_waiters(db, 2)  # and the next producer waits behind the swap
            assert sync.is_alive() and producer.is_alive()
            held_transaction.commit()
            sync.join(60)
            producer.join(60)
            assert synced.error is None, synced
            if in_place:
                assert produced.error is None, produced
                second = produced.value
            else:  # MySQL proper: the routine was dropped under it
                assert isinstance(produced.error, assetq.RoutineUnavailable), produced
                assert db.scalar("SELECT count(*) FROM {ns}.asset_event") == 2  # none written
                second = produce()  # the retry
            with db.engine.connect() as conn:
                recorded = routines.catalogue(conn, db.namespace)
                left = routines.differences(conn, db.namespace)
        for f in files[db.engine_name]:
            if f.name in FAN_OUT[db.engine_name]:
                assert recorded[(f.kind, f.name)].checksum == f.checksum, f.name
        assert left == []
    finally:
        held.close()
    queued = db.rows(
        "SELECT asset_event_id, target_dag_id FROM {ns}.asset_dag_run_queue"
        " WHERE asset_event_id IN (:a, :b) ORDER BY 1, 2",
        a=first.id,
        b=second,
    )
    assert [(r.asset_event_id, r.target_dag_id) for r in queued] == [
        (first.id, "direct"),
        (first.id, "report"),
        (second, "direct"),
        (second, "report"),
    ]


def test_a_raw_insert_during_the_swap_is_fanned_out_too(
    db: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """I1 holds for any program's INSERT, not only register_event's: one that waits for the
    swap is fanned out by the new trigger."""
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "direct", "orders", namespace=db.namespace)
        assetq.register_event(conn, "orders", namespace=db.namespace)
    asset_id = db.scalar("SELECT id FROM {ns}.asset WHERE name = 'orders'")
    held = db.engine.connect()
    held_transaction = held.begin()
    held.execute(
        sa.text(db.sql("INSERT INTO {ns}.asset_event (asset_id) VALUES (:a)")), {"a": asset_id}
    )
    try:
        with shipped(monkeypatch, {db.engine_name: FAN_OUT[db.engine_name]}):
            sync, synced = in_thread(
                lambda: assetq.install(db.engine, namespace=db.namespace, lock_timeout=60)
            )
            _wait_for_waiters(db, 1)

            def insert() -> None:
                with db.engine.begin() as conn:
                    conn.execute(
                        sa.text(db.sql("INSERT INTO {ns}.asset_event (asset_id) VALUES (:a)")),
                        {"a": asset_id},
                    )

            producer, produced = in_thread(insert)
            _wait_for_waiters(db, 2)
            held_transaction.commit()
            sync.join(60)
            producer.join(60)
            assert synced.error is None and produced.error is None, (synced, produced)
    finally:
        held.close()
    unqueued = db.scalar(
        "SELECT count(*) FROM {ns}.asset_event e WHERE NOT EXISTS"
        " (SELECT 1 FROM {ns}.asset_dag_run_queue q WHERE q.asset_event_id = e.id)"
    )
    assert db.scalar("SELECT count(*) FROM {ns}.asset_event") == 3 and unqueued == 0
