"""Registration: atomic fan-out (I1), shared timestamp (I2), idempotency (I7)."""

from __future__ import annotations

from datetime import timezone

import pytest
import sqlalchemy as sa

import assetq
from dbs import TestDatabase


def _declare(db: TestDatabase, dag_id: str, condition: assetq.Condition, **kw: object) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, dag_id, condition, **kw)  # type: ignore[arg-type]


def test_register_returns_event_with_id_asset_and_utc_timestamp(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        event = assetq.register_event(conn, "orders", extra={"rows": 10})
    assert event.asset == "orders"
    assert event.created is True
    assert event.timestamp.tzinfo is timezone.utc
    stored = db.rows("SELECT asset_id, extra FROM {ns}.asset_event WHERE id = :id", id=event.id)
    assert len(stored) == 1
    assert stored[0].asset_id == event.asset_id


def test_register_queues_one_row_per_unpaused_consumer(db: TestDatabase) -> None:
    _declare(db, "a_consumer", "orders")
    _declare(db, "b_consumer", ["orders", "customers"])
    _declare(db, "paused_consumer", "orders", paused=True)
    _declare(db, "other_consumer", "customers")
    with db.engine.begin() as conn:
        event = assetq.register_event(conn, "orders")
    queued = db.rows(
        "SELECT target_dag_id FROM {ns}.asset_dag_run_queue WHERE asset_event_id = :id"
        " ORDER BY target_dag_id",
        id=event.id,
    )
    assert [r.target_dag_id for r in queued] == ["a_consumer", "b_consumer"]


def test_raw_insert_into_asset_event_fans_out_like_the_routine(db: TestDatabase) -> None:
    _declare(db, "a_consumer", "orders")
    _declare(db, "b_consumer", "orders")
    asset_id = db.scalar("SELECT id FROM {ns}.asset WHERE name = 'orders'")
    db.execute("INSERT INTO {ns}.asset_event (asset_id) VALUES (:a), (:a)", a=asset_id)
    rows = db.rows(
        "SELECT q.target_dag_id, q.asset_event_id, q.created_at, e.timestamp"
        " FROM {ns}.asset_dag_run_queue q JOIN {ns}.asset_event e ON e.id = q.asset_event_id"
    )
    assert len(rows) == 4  # two events, two consumers each
    assert sorted({r.target_dag_id for r in rows}) == ["a_consumer", "b_consumer"]


def test_every_queue_row_carries_exactly_the_event_timestamp(db: TestDatabase) -> None:
    for n in range(5):
        _declare(db, f"consumer_{n}", "orders")
    with db.engine.begin() as conn:
        events = [assetq.register_event(conn, "orders") for _ in range(3)]
    rows = db.rows(
        "SELECT q.asset_event_id, q.created_at, e.timestamp AS ts"
        " FROM {ns}.asset_dag_run_queue q JOIN {ns}.asset_event e ON e.id = q.asset_event_id"
    )
    assert len(rows) == 15
    assert all(r.created_at == r.ts for r in rows)
    by_event = {e.id: e.timestamp for e in events}
    assert {r.asset_event_id for r in rows} == set(by_event)


def test_rollback_of_the_producer_leaves_no_event_and_no_queue_row(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    before = db.counts()
    with db.engine.connect() as conn, conn.begin() as tx:
        assetq.register_event(conn, "orders")
        assetq.register_event(conn, "orders", idempotency_key="k")
        tx.rollback()
    assert db.counts() == before


def test_register_by_uri_finds_the_asset(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, "orders", uri="s3://bucket/orders")
        assetq.declare_dag(conn, "consumer", "orders")
        event = assetq.register_event(conn, "s3://bucket/orders")
    assert event.asset_id == db.scalar("SELECT id FROM {ns}.asset WHERE name = 'orders'")
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == 1


def test_retry_with_same_idempotency_key_returns_original_and_queues_nothing(
    db: TestDatabase,
) -> None:
    _declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        first = assetq.register_event(conn, "orders", extra={"a": 1}, idempotency_key="run-7")
    with db.engine.begin() as conn:
        retry = assetq.register_event(conn, "orders", extra={"a": 1}, idempotency_key="run-7")
    assert retry.id == first.id
    assert retry.timestamp == first.timestamp
    assert (first.created, retry.created) == (True, False)
    assert db.scalar("SELECT count(*) FROM {ns}.asset_event") == 1
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == 1


def test_idempotency_key_is_per_asset(db: TestDatabase) -> None:
    _declare(db, "consumer", ["orders", "customers"])
    with db.engine.begin() as conn:
        a = assetq.register_event(conn, "orders", idempotency_key="k")
        b = assetq.register_event(conn, "customers", idempotency_key="k")
    assert a.id != b.id and a.created and b.created


def test_reusing_an_idempotency_key_with_a_different_extra_is_refused(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        assetq.register_event(conn, "orders", extra={"a": 1}, idempotency_key="k")
    before = db.counts()
    with pytest.raises(assetq.IdempotencyConflict) as info, db.engine.begin() as conn:
        assetq.register_event(conn, "orders", extra={"a": 2}, idempotency_key="k")
    assert info.value.code == "AQ005"
    assert db.counts() == before


def test_retry_after_a_lost_commit_acknowledgement_creates_one_event(db: TestDatabase) -> None:
    """The producer committed but never heard back; it retries with the same key."""
    _declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        assetq.register_event(conn, "orders", idempotency_key="attempt")
    # ... the acknowledgement was lost; the retry runs in a brand-new transaction:
    with db.engine.begin() as conn:
        again = assetq.register_event(conn, "orders", idempotency_key="attempt")
    assert again.created is False
    assert db.scalar("SELECT count(*) FROM {ns}.asset_event") == 1


def test_events_committed_while_paused_are_not_queued_and_not_replayed(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        assetq.pause_dag(conn, "consumer")
        assetq.register_event(conn, "orders")
    with db.engine.begin() as conn:
        assetq.unpause_dag(conn, "consumer")
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == 0
    with db.engine.begin() as conn:
        assetq.register_event(conn, "orders")
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == 1


def test_source_fields_are_stored(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    src = assetq.Source(dag_id="producer", task_id="load", run_id="manual__1", map_index=3)
    with db.engine.begin() as conn:
        event = assetq.register_event(conn, "orders", source=src)
    row = db.rows(
        "SELECT source_dag_id, source_task_id, source_run_id, source_map_index"
        " FROM {ns}.asset_event WHERE id = :id",
        id=event.id,
    )[0]
    assert tuple(row) == ("producer", "load", "manual__1", 3)


def test_a_producer_killed_before_commit_leaves_nothing(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    before = db.counts()
    with db.engine.connect() as producer:
        assetq.register_event(producer, "orders")
        db.kill(producer)
        with pytest.raises(sa.exc.DBAPIError):
            producer.commit()
    assert db.counts() == before


def test_on_an_autocommit_connection_one_call_commits_the_event_with_its_queue_rows(
    db: TestDatabase,
) -> None:
    """The cheapest way to register one event by itself: one round trip, still atomic (one
    writing statement, its trigger included)."""
    _declare(db, "a_consumer", "orders")
    _declare(db, "b_consumer", "orders")
    with db.engine.connect() as raw:
        conn = raw.execution_options(isolation_level="AUTOCOMMIT")
        event = assetq.register_event(conn, "orders")
        # Seen from another connection before this one does anything else.
        queued = db.rows(
            "SELECT target_dag_id FROM {ns}.asset_dag_run_queue WHERE asset_event_id = :id",
            id=event.id,
        )
    assert sorted(r.target_dag_id for r in queued) == ["a_consumer", "b_consumer"]
